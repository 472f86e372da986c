package placement

import (
	"pgregory.net/rapid"

	"fmt"
	"math"
	"testing"
)

// uniformNodes returns n unlabelled, unlimited nodes of weight 1.
func uniformNodes(n int) []Node { return nodesNamed("node-%03d", n) }

// uniformWorkloads returns count workloads of replicas replicas each.
func uniformWorkloads(count, replicas int) []Workload {
	ws := make([]Workload, count)
	for i := range ws {
		ws[i] = Workload{Key: fmt.Sprintf("default/app-%04d", i), Replicas: replicas}
	}
	return ws
}

// loads counts the replicas each node owns.
func loads(p Placement) map[string]int {
	out := make(map[string]int)
	for _, owners := range p.Owners {
		for _, o := range owners {
			if o != "" {
				out[o]++
			}
		}
	}
	return out
}

// churn returns how many replicas change owner between before and after,
// and how many before had on node gone.
func churn(before, after Placement, gone string) (moved, orphaned int) {
	for key, owners := range before.Owners {
		for ord, o := range owners {
			if o == gone {
				orphaned++
			}
			if after.Owner(key, ord) != o {
				moved++
			}
		}
	}
	return moved, orphaned
}

// stabilityRatio removes each of the first departures nodes in turn and
// returns the mean and worst ratio of replicas moved to replicas orphaned.
func stabilityRatio(nodes []Node, ws []Workload, opts Options, departures int) (mean, worst float64) {
	before := Assign(nodes, ws, opts)
	var sumMoved, sumOrphaned int
	for d := range departures {
		rest := append(append([]Node(nil), nodes[:d]...), nodes[d+1:]...)
		moved, orphaned := churn(before, Assign(rest, ws, opts), nodes[d].Name)
		sumMoved += moved
		sumOrphaned += orphaned
		if orphaned > 0 {
			worst = max(worst, float64(moved)/float64(orphaned))
		}
	}
	return float64(sumMoved) / float64(sumOrphaned), worst
}

// TestStabilityWhenOneNodeLeaves measures churn: when one of 100 nodes
// leaves, replicas that change owner per replica the node held. 1 is
// the minimum; the excess comes from the load bound (a newcomer at a node
// near its bound can push another replica on, which can push another) and
// from spread. Plain rendezvous is logged for comparison.
func TestStabilityWhenOneNodeLeaves(t *testing.T) {
	for _, tc := range []struct {
		replicas   int
		loadFactor float64
		departures int     // the first this many nodes leave, one at a time
		maxMean    float64 // assertion on the mean ratio; 0 means log only
	}{
		// Placing each workload's ordinals in ascending order (so that
		// changing replicas moves nothing else) costs churn here: 1.44 and
		// 1.04 in pure claim order, 1.75 and 1.06 now.
		{1000, 0, 100, 1.85},
		{10000, 0, 20, 1.5},
		{1000, math.Inf(1), 100, 0},
		{10000, math.Inf(1), 20, 0},
	} {
		t.Run(fmt.Sprintf("%d replicas c=%v", tc.replicas, tc.loadFactor), func(t *testing.T) {
			mean, worst := stabilityRatio(uniformNodes(100), uniformWorkloads(tc.replicas/10, 10), Options{LoadFactor: tc.loadFactor}, tc.departures)
			t.Logf("100 nodes, %d replicas, LoadFactor %v, %d departures: moved/orphaned mean %.3f, worst %.3f",
				tc.replicas, tc.loadFactor, tc.departures, mean, worst)
			if tc.maxMean > 0 && mean > tc.maxMean {
				t.Errorf("mean moved/orphaned %.3f, want <= %.2f", mean, tc.maxMean)
			}
		})
	}
}

// TestBalance checks max/mean node load against the load factor on 100
// equal nodes; plain rendezvous is logged for comparison.
func TestBalance(t *testing.T) {
	for _, replicas := range []int{1000, 10000} {
		nodes, ws := uniformNodes(100), uniformWorkloads(replicas/10, 10)
		ratio := func(opts Options) float64 {
			most := 0
			for _, l := range loads(Assign(nodes, ws, opts)) {
				most = max(most, l)
			}
			return float64(most) / (float64(replicas) / 100)
		}
		bounded, plain := ratio(Options{}), ratio(Options{LoadFactor: math.Inf(1)})
		t.Logf("100 nodes, %d replicas: max/mean %.3f (plain rendezvous %.3f)", replicas, bounded, plain)
		if bounded > DefaultLoadFactor {
			t.Errorf("%d replicas: max/mean %.3f, want <= %v", replicas, bounded, DefaultLoadFactor)
		}
	}
}

// TestScalingMovesNoOtherReplica guards "changing only replicas restarts
// nothing": scaling one workload up or down keeps every remaining ordinal
// of it on its node, whatever the other workloads are (no load bound and
// no requests, which are the two things that may legitimately push one).
func TestScalingMovesNoOtherReplica(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes := uniformNodes(rapid.IntRange(1, 12).Draw(t, "nodes"))
		others := uniformWorkloads(rapid.IntRange(0, 5).Draw(t, "others"), rapid.IntRange(1, 8).Draw(t, "otherReplicas"))
		from, to := rapid.IntRange(0, 30).Draw(t, "from"), rapid.IntRange(0, 30).Draw(t, "to")
		opts := Options{LoadFactor: math.Inf(1)}
		before := Assign(nodes, append(others, Workload{Key: "ns/scaled", Replicas: from}), opts)
		after := Assign(nodes, append(others, Workload{Key: "ns/scaled", Replicas: to}), opts)
		for ord := 0; ord < min(from, to); ord++ {
			if b, a := before.Owners["ns/scaled"][ord], after.Owners["ns/scaled"][ord]; a != b {
				t.Fatalf("scaling %d -> %d moved ordinal %d from %s to %s", from, to, ord, b, a)
			}
		}
	})
}
