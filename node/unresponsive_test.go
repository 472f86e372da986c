package node

import (
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

func TestUnreportedFindsNodesThatDoNotListTheirReplicas(t *testing.T) {
	all := []reconcile.Replica{
		{ID: "default_web-1", Name: "web-abc-0", Namespace: "default"},
		{ID: "default_web-2", Name: "web-abc-1", Namespace: "default"},
		{ID: "default_db-0", Name: "db-0", Namespace: "default"},
	}
	owner := map[string]string{"default_web-1": "a", "default_web-2": "fake", "default_db-0": "b"}
	statuses := map[string]NodeStatus{
		"a":    {Replicas: []api.Replica{{Name: "web-abc-0", Namespace: "default", Phase: "Pending"}}},
		"b":    {Replicas: []api.Replica{{Name: "db-0", Namespace: "other"}}}, // another namespace's db-0
		"fake": {Replicas: []api.Replica{{Name: "ghost-0", Namespace: "default", Phase: "Running"}}},
	}
	got := unreported(all, owner, statuses)
	if len(got) != 2 || !got["b"] || !got["fake"] {
		t.Fatalf("unreported = %v, want b and fake", got)
	}
}

// TestAckTrackerExcludesAfterTimeoutWithBackoff: a node is left out of
// placement only after leaving a replica unlisted for the whole timeout,
// for the timeout, then twice as long each time it happens again within
// strikeMemory (at most maxExclusion); listing its replicas in time
// resets the clock.
func TestAckTrackerExcludesAfterTimeoutWithBackoff(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := newAckTracker(30 * time.Second)
	fake := map[string]bool{"fake": true}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	if x := tr.observe(at(0), fake); len(x) != 0 {
		t.Fatal("excluded at first sight")
	}
	if x := tr.observe(at(20*time.Second), map[string]bool{}); len(x) != 0 {
		t.Fatal("excluded after listing")
	}
	tr.observe(at(25*time.Second), fake) // the clock starts again
	if x := tr.observe(at(50*time.Second), fake); len(x) != 0 {
		t.Fatal("excluded before the timeout")
	}
	x := tr.observe(at(56*time.Second), fake)
	if len(x) != 1 || x[0].node != "fake" || x[0].for_ != 30*time.Second {
		t.Fatalf("first exclusion = %+v", x)
	}
	if !tr.excluded(at(80 * time.Second))["fake"] || tr.excluded(at(87 * time.Second))["fake"] {
		t.Fatal("exclusion does not last exactly 30s")
	}
	tr.observe(at(87*time.Second), fake)
	x = tr.observe(at(118*time.Second), fake)
	if len(x) != 1 || x[0].for_ != 60*time.Second {
		t.Fatalf("second exclusion = %+v, want 60s", x)
	}
	for i := 0; i < 8; i++ {
		now := at(time.Duration(200+i*700) * time.Second)
		tr.observe(now, fake)
		x = tr.observe(now.Add(31*time.Second), fake)
	}
	if len(x) != 1 || x[0].for_ != 30*time.Second {
		t.Fatalf("after %s without exclusions the backoff should restart: %+v", strikeMemory, x)
	}
}
