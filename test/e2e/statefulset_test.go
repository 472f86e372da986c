package e2e

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// runningCopies returns, for each StatefulSet replica ID, the nodes whose
// cgroups hold a process of it: the truth, read from the kernel, not from
// any agent.
func runningCopies(nodes []*harness.Node, prefix string) map[string][]string {
	out := map[string][]string{}
	for _, n := range nodes {
		for id := range n.TaskPIDs() {
			if strings.HasPrefix(id, prefix) {
				out[id] = append(out[id], n.Name)
			}
		}
	}
	return out
}

// duplicateWatch samples every node's cgroups every 100 ms and records
// any StatefulSet replica running on two nodes at once.
type duplicateWatch struct {
	stop    func()
	mu      sync.Mutex
	dups    []string
	samples int
}

func watchDuplicates(nodes []*harness.Node, prefix string) *duplicateWatch {
	w := &duplicateWatch{}
	w.stop = every(100*time.Millisecond, func() {
		copies := runningCopies(nodes, prefix)
		w.mu.Lock()
		w.samples++
		for id, on := range copies {
			if len(on) > 1 {
				w.dups = append(w.dups, fmt.Sprintf("%s on %v at %s", id, on, time.Now().Format("15:04:05.000")))
			}
		}
		w.mu.Unlock()
	})
	return w
}

func (w *duplicateWatch) finish() ([]string, int) {
	w.stop()
	return w.dups, w.samples
}

// TestStatefulSetAtMostOneUnderPartition partitions 5 nodes 2 | 3 with a
// 3-replica StatefulSet running, sampling every node's cgroups every
// 100 ms: no ordinal ever runs twice; the minority kills its copies; the
// majority runs all 3 within the failover timeout after failure detection;
// after the heal the cluster converges with no duplicate.
func TestStatefulSetAtMostOneUnderPartition(t *testing.T) {
	c := newCluster(t, 5)
	n1 := c.Nodes[0]
	importEcho(t, n1)
	waitReadyNodes(t, n1, 5)
	apply(t, n1, harness.App{Name: "db", Replicas: 3, Grace: harness.Seconds(2), Ports: harness.HTTPPort,
		Readiness: harness.HTTPProbe("/healthz", 0)}.StatefulSet("db"))
	const prefix = "default_db-"
	placed := func() (map[string]string, error) {
		copies := runningCopies(c.Nodes, prefix)
		where := map[string]string{}
		for i := 0; i < 3; i++ {
			id := fmt.Sprintf("%s%d", prefix, i)
			if len(copies[id]) != 1 {
				return nil, fmt.Errorf("%s runs on %v", id, copies[id])
			}
			where[id] = copies[id][0]
		}
		if len(copies) != 3 {
			return nil, fmt.Errorf("copies: %v", copies)
		}
		return where, nil
	}
	var where map[string]string
	took, err := eventually(120*time.Second, func() (err error) { where, err = placed(); return err })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("StatefulSet db: 3 replicas running once each in %v: %v", took.Round(time.Millisecond), where)
	names := []string{}
	all, err := replicas(n1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.Workload == "db" {
			names = append(names, r.Name)
		}
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "db-0 db-1 db-2" {
		t.Fatalf("StatefulSet replica names %v, want db-0 db-1 db-2", names)
	}

	// An agent killed with -9 and restarted adopts its StatefulSet replica
	// untouched: right after a restart the quorum is unknown, and an
	// unknown quorum keeps what runs.
	var host *harness.Node
	for _, n := range c.Nodes {
		if n.Name == where[prefix+"0"] {
			host = n
		}
	}
	before := fmt.Sprint(host.TaskPIDs()[prefix+"0"])
	host.KillAgent(9)
	if err := host.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	if _, err := eventually(30*time.Second, func() error {
		_, err := apiReplicas(host)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // several reconciles and ping rounds
	if after := fmt.Sprint(host.TaskPIDs()[prefix+"0"]); after != before {
		t.Fatalf("agent restart on %s touched db-0: pids %s -> %s", host.Name, before, after)
	}
	if where, err = placed(); err != nil {
		t.Fatal("after the agent restart: ", err)
	}
	t.Logf("agent on %s killed -9 and restarted: db-0 kept its process (%s)", host.Name, before)

	// The minority: the two nodes running the most db replicas.
	count := map[string]int{}
	for _, n := range where {
		count[n]++
	}
	nodes := append([]*harness.Node(nil), c.Nodes...)
	sort.SliceStable(nodes, func(i, j int) bool { return count[nodes[i].Name] > count[nodes[j].Name] })
	minority, majority := nodes[:2], nodes[2:]
	moved := count[minority[0].Name] + count[minority[1].Name]
	t.Logf("partition: minority %s+%s (running %d db replicas) | majority %s %s %s",
		minority[0].Name, minority[1].Name, moved, majority[0].Name, majority[1].Name, majority[2].Name)

	w := watchDuplicates(c.Nodes, prefix)
	cut := time.Now()
	if err := c.Partition(minority); err != nil {
		t.Fatal(err)
	}
	fenced, err := eventually(60*time.Second, func() error {
		if got := runningCopies(minority, prefix); len(got) != 0 {
			return fmt.Errorf("minority still runs %v", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = eventually(90*time.Second, func() error {
		got := runningCopies(majority, prefix)
		if len(got) != 3 {
			return fmt.Errorf("majority runs %v", got)
		}
		return nil
	})
	failover := time.Since(cut)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("minority fenced (no db process left) %v after the cut; majority runs all 3 %v after the cut",
		fenced.Round(time.Millisecond), failover.Round(time.Millisecond))
	// Failure detection (~5-8 s) plus the 15 s failover timeout.
	if failover > 40*time.Second {
		t.Fatalf("majority took %v to run all 3, want under 40s (detection + --failover-timeout 15s)", failover)
	}
	// --fence-timeout 3s, plus a ping round and the SIGKILL; the majority
	// starts nothing before detection (~5-9 s) + --failover-timeout 15s.
	if fenced >= 8*time.Second {
		t.Fatalf("minority took %v to fence, want under 8s (--fence-timeout 3s)", fenced)
	}

	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	took, err = eventually(120*time.Second, func() error {
		if _, err := placed(); err != nil {
			return err
		}
		out, err := n1.CLI("get", "nodes")
		if err != nil {
			return err
		}
		if strings.Count(out, " alive ") != 5 {
			return fmt.Errorf("want 5 alive:\n%s", out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Let rebalancing after the rejoin settle run too: ordinals whose
	// holders are over their load bound move back to the rejoined nodes
	// (stop, then start there), so one may briefly run nowhere, never
	// twice.
	time.Sleep(20 * time.Second)
	back, err := eventually(30*time.Second, func() error { _, err := placed(); return err })
	if err != nil {
		t.Fatal("after heal and settle: ", err)
	}
	dups, samples := w.finish()
	t.Logf("healed: converged %v after heal, all 3 running once %v after the settle; %d samples of all nodes' cgroups every 100 ms, %d duplicates",
		took.Round(time.Millisecond), back.Round(time.Millisecond), samples, len(dups))
	if len(dups) > 0 {
		t.Fatalf("an ordinal ran twice: %v", dups)
	}
}
