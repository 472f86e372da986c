package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Placement runs once per change of its inputs on each node, and only in
// the view's builder: an idle cluster computes none, API reads and status
// changes (replicas starting, becoming ready) compute none, and one
// Deployment applied makes each node compute exactly one.
func TestPlacementRunsOncePerChange(t *testing.T) {
	nodes := startCluster(t, 3)
	placements := func() []float64 {
		var out []float64
		for _, n := range nodes {
			out = append(out, testutil.ToFloat64(n.agent.metrics.placements))
		}
		return out
	}
	quiet := func() []float64 {
		t.Helper()
		// Settled: no placement for 3 s (membership and subnets are
		// still settling just after start).
		var last []float64
		waitFor(t, 20*time.Second, func() error {
			before := placements()
			time.Sleep(3 * time.Second)
			last = placements()
			if fmt.Sprint(before) != fmt.Sprint(last) {
				return fmt.Errorf("placements went from %v to %v", before, last)
			}
			return nil
		})
		return last
	}
	idle := quiet()
	for range 50 {
		for _, n := range nodes {
			n.agent.info.Replicas()
			call(t, n, "GET", "/v1/nodes", nil, nil)
			call(t, n, "GET", "/v1/objects/deployment", nil, nil)
		}
	}
	if got := placements(); fmt.Sprint(got) != fmt.Sprint(idle) {
		t.Fatalf("API reads computed placements: %v -> %v", idle, got)
	}
	deploy(t, nodes[0], "web", 6, "img:v1")
	waitFor(t, 20*time.Second, func() error { return runningEverywhere(nodes, "web", 6) })
	after := quiet()
	for i := range nodes {
		if after[i] != idle[i]+1 {
			t.Errorf("%s computed %v placements for one Deployment applied (and its 6 replicas started), want 1", nodes[i].name, after[i]-idle[i])
		}
	}
}
