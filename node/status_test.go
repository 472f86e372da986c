package node

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/starling-orchestrator/starling/node/api"
)

// A burst of replica changes is published as a few records, not one per
// change: each record goes to every node, so a node whose 20 replicas
// start over a second (each start's end runs a reconcile pass) writes at
// most one record per publishGap, and the last one holds every replica's
// final state.
func TestStatusBurstIsCoalesced(t *testing.T) {
	n := start(t, "solo", t.TempDir(), nil)
	waitFor(t, 20*time.Second, func() error {
		if !n.agent.subnets.isReady() {
			return fmt.Errorf("no subnet yet")
		}
		return nil
	})
	n.rt.mu.Lock()
	n.rt.createLag = func() time.Duration { return time.Duration(rand.Int64N(int64(time.Second))) }
	n.rt.mu.Unlock()
	writes := func() float64 { return testutil.ToFloat64(n.agent.metrics.statusWrites) }
	before, t0 := writes(), time.Now()
	deploy(t, n, "burst", 20, "img:v1")
	var took time.Duration
	waitFor(t, 20*time.Second, func() error {
		rec, ok, err := n.agent.store.Get(statusKey("solo"))
		if err != nil || !ok {
			return fmt.Errorf("no status record: %v", err)
		}
		var s NodeStatus
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
	// The gap doubles from 250 ms to 2 s within the burst: records at
	// 0, 0.25, 0.75, 1.75 and 3.75 s, then one every 2 s.
	limit := 5 + took.Seconds()/2
	t.Logf("20 replicas started over %v: %v records published (at most %.0f)", took.Round(time.Millisecond), got, limit)
	if got > limit {
		t.Fatalf("%v records published in %v for 20 replica starts, want at most %.0f", got, took, limit)
	}
}

// Within a burst the least time between two publications doubles from
// publishGap up to maxPublishGap; after a quiet spell a change is
// published at once again.
func TestStatusGapGrowsWithinABurstAndResets(t *testing.T) {
	n := start(t, "solo", t.TempDir(), nil)
	s := n.agent.status
	t0 := time.Now().Add(time.Hour) // later than anything the agent's own loop publishes
	seq := 0
	next := func() []api.Replica {
		seq++
		return []api.Replica{{Name: fmt.Sprintf("r-%d", seq), Namespace: "default", Workload: "r", Phase: api.PhasePending}}
	}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	if wait := s.publishSoon(next(), at(0)); wait != 0 {
		t.Fatalf("the first change waits %v", wait)
	}
	// Each change comes as soon as the gap allows: 250 ms, then 500 ms,
	// 1 s, 2 s, 2 s.
	now := time.Duration(0)
	for _, gap := range []time.Duration{250, 500, 1000, 2000, 2000} {
		gap *= time.Millisecond
		local := next()
		if wait := s.publishSoon(local, at(now+10*time.Millisecond)); wait != gap-10*time.Millisecond {
			t.Fatalf("a change 10 ms after the publication at %v waits %v, want %v", now, wait, gap-10*time.Millisecond)
		}
		now += gap
		if wait := s.publishSoon(local, at(now)); wait != 0 {
			t.Fatalf("the change at %v waits %v more", now, wait)
		}
	}
	// A quiet spell: the next change goes at once, and the one after it
	// waits the first gap again.
	now += time.Minute
	if wait := s.publishSoon(next(), at(now)); wait != 0 {
		t.Fatalf("a change after a quiet minute waits %v", wait)
	}
	if wait := s.publishSoon(next(), at(now+10*time.Millisecond)); wait != publishGap-10*time.Millisecond {
		t.Fatalf("after the quiet spell, the next change waits %v, want %v", wait, publishGap-10*time.Millisecond)
	}
}
