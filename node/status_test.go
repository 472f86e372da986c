package node

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/starling-orchestrator/starling/node/view"
)

// A burst of replica changes is published as a few records, not one per
// change: each record goes to every node, so a node whose 20 replicas
// start over a second (each start's end runs a reconcile pass) writes at
// most one record per publishGap, and the last one holds every replica's
// final state.
func TestStatusBurstIsCoalesced(t *testing.T) {
	n := start(t, "solo", t.TempDir(), nil)
	waitSubnetSettled(t, n, 20*time.Second)
	n.rt.mu.Lock()
	n.rt.createLag = func() time.Duration { return time.Duration(rand.Int64N(int64(time.Second))) }
	n.rt.mu.Unlock()
	writes := func() float64 { return testutil.ToFloat64(n.agent.metrics.statusWrites) }
	before, t0 := writes(), time.Now()
	deploy(t, n, "burst", 20, "img:v1")
	var took time.Duration
	waitFor(t, 20*time.Second, func() error {
		rec, ok, err := n.agent.store.Get(view.StatusKey("solo"))
		if err != nil || !ok {
			return fmt.Errorf("no status record: %v", err)
		}
		var s view.NodeStatus
		if err := json.Unmarshal(rec.Value, &s); err != nil {
			return err
		}
		running := 0
		for _, r := range s.Replicas {
			if r.Available() {
				running++
			}
		}
		if running != 20 {
			return fmt.Errorf("the published record lists %d of 20 replicas running and ready", running)
		}
		took = time.Since(t0)
		return nil
	})
	got := writes() - before
	limit := took.Seconds()/0.25 + 3 // publishGap: 250 ms
	t.Logf("20 replicas started over %v: %v records published (at most %.0f)", took.Round(time.Millisecond), got, limit)
	if got > limit {
		t.Fatalf("%v records published in %v for 20 replica starts, want at most %.0f (one per 250 ms)", got, took, limit)
	}
}
