package placement

import (
	"fmt"
	"testing"
)

// mixedCluster is a heterogeneous cluster: three weights, finite
// allocatable, two zones, and workloads with requests and selectors.
func mixedCluster(nodes, workloads, replicas int) ([]Node, []Workload) {
	ns := make([]Node, nodes)
	for i := range ns {
		ns[i] = Node{
			Name:        fmt.Sprintf("node-%04d", i),
			Weight:      []float64{1, 2, 4}[i%3],
			Labels:      map[string]string{"zone": []string{"a", "b"}[i%2]},
			Allocatable: Resources{MilliCPU: 64000, MemoryBytes: 256 << 30},
		}
	}
	ws := uniformWorkloads(workloads, replicas)
	for i := range ws {
		ws[i].Requests = Resources{MilliCPU: 250, MemoryBytes: 512 << 20}
		if i%4 == 0 {
			ws[i].NodeSelector = map[string]string{"zone": "a"}
		}
	}
	return ns, ws
}

func benchmarkAssign(b *testing.B, assign func([]Node, []Workload, Options) Placement, nodes []Node, ws []Workload) {
	b.ReportAllocs()
	for b.Loop() {
		assign(nodes, ws, Options{})
	}
}

func BenchmarkAssign10kReplicas1kNodes(b *testing.B) {
	benchmarkAssign(b, Assign, uniformNodes(1000), uniformWorkloads(1000, 10))
}

func BenchmarkAssign10kReplicas1kNodesMixed(b *testing.B) {
	nodes, ws := mixedCluster(1000, 1000, 10)
	benchmarkAssign(b, Assign, nodes, ws)
}

func BenchmarkAssign1kReplicas100Nodes(b *testing.B) {
	benchmarkAssign(b, Assign, uniformNodes(100), uniformWorkloads(100, 10))
}

// The reference implementation (a full sort per replica) is the "before".

func BenchmarkReference10kReplicas1kNodes(b *testing.B) {
	benchmarkAssign(b, assignReference, uniformNodes(1000), uniformWorkloads(1000, 10))
}

func BenchmarkReference1kReplicas100Nodes(b *testing.B) {
	benchmarkAssign(b, assignReference, uniformNodes(100), uniformWorkloads(100, 10))
}

func BenchmarkRank1kNodes(b *testing.B) {
	nodes := uniformNodes(1000)
	b.ReportAllocs()
	for b.Loop() {
		Rank(nodes, "default/web", 3)
	}
}
