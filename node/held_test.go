package node

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// where maps each running replica of the workloads named prefix* to its
// node.
func where(nodes []*testNode, prefix string) map[string]string {
	out := map[string]string{}
	for _, n := range nodes {
		for _, id := range n.rt.ids() {
			if strings.Contains(id, "_"+prefix) {
				out[id] = n.name
			}
		}
	}
	return out
}

// A node that returns takes back only what its peers cannot keep under
// their load bound (placement.Keep): each move restarts a replica and
// sends the cluster two or more records. Here 5 nodes run 8 Deployments
// of 2 replicas; a node's 3 or 4 go to the other 4; when it is back, the
// bound is 4 replicas a node (16 x 1.25 / 5): replicas move only off a
// node that holds more, and only to the returning node. Before Keep,
// rendezvous hashing moved its whole share back and bounded loads moved
// more between the others.
func TestReturningNodeTakesBackOnlyWhatItsPeersCannotKeep(t *testing.T) {
	const bound = 4
	nodes := startCluster(t, 5)
	for i := range 8 {
		deploy(t, nodes[0], fmt.Sprintf("keep%d", i), 2, "img:v1")
	}
	all := func(ns []*testNode) error {
		for i := range 8 {
			if err := runningEverywhere(ns, fmt.Sprintf("keep%d", i), 2); err != nil {
				return err
			}
		}
		return nil
	}
	waitFor(t, 30*time.Second, func() error { return all(nodes) })
	gone := nodes[4]
	gone.stop()
	waitFor(t, 30*time.Second, func() error { return all(nodes[:4]) })
	before := where(nodes[:4], "keep")
	load := map[string]int{}
	for _, n := range before {
		load[n]++
	}
	excess := 0
	for _, l := range load {
		excess += max(0, l-bound)
	}

	back := start(t, gone.name, gone.dir, []string{nodes[0].addr()})
	now := append(nodes[:4:4], back)
	check := func() error {
		if err := all(now); err != nil {
			return err
		}
		var bad []string
		took := 0
		for id, n := range where(now, "keep") {
			switch from := before[id]; {
			case n == from:
			case n != back.name || load[from] <= bound:
				bad = append(bad, fmt.Sprintf("%s from %s (%d replicas) to %s", id, from, load[from], n))
			default:
				took++
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("replicas moved that their node could keep: %s", strings.Join(bad, ", "))
		}
		if took != excess {
			return fmt.Errorf("the returning node took %d replicas, want the %d over the bound of %d (loads %v)", took, excess, bound, load)
		}
		return nil
	}
	waitFor(t, 30*time.Second, check)
	// Settled: the returning node's view holds every record; still so.
	time.Sleep(3 * time.Second)
	if err := check(); err != nil {
		t.Fatal(err)
	}
	back.rt.mu.Lock()
	created := back.rt.created
	back.rt.mu.Unlock()
	t.Logf("loads before the return %v: the returning node took back the %d replicas over the bound of %d (it created %d)", load, excess, bound, created)
}
