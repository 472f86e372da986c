package node

import (
	"errors"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// A replica whose create failed (its image cannot be found) shows the
// failure's reason while the next try runs, not only between tries (it
// showed ContainerCreating with an empty reason in most polls).
func TestFailureReasonShowsDuringTheRetry(t *testing.T) {
	r := &replicas{self: "n1", rt: newFakeRuntime(), acts: newActions()}
	d := reconcile.Replica{ID: "default_web-1", Name: "web-1", Namespace: "default", Workload: "web", Ordinal: 1, SpecHash: "abc"}
	create := reconcile.Action{Type: reconcile.Create, Replica: d}
	reason := func() (api.Phase, string) {
		items := r.localReplicas(nil, []reconcile.Replica{d}, nil)
		if len(items) != 1 {
			t.Fatalf("items %+v", items)
		}
		return items[0].Phase, items[0].Reason
	}
	if !r.acts.claim(create, r.acts.listEpoch()) {
		t.Fatal("claim")
	}
	if phase, why := reason(); phase != api.PhaseContainerCreating || why != "" {
		t.Fatalf("first try: %s %q", phase, why)
	}
	r.acts.recordFailure(create, errors.New(`image "img:missing" not found on this node or any peer`), time.Now())
	r.acts.finish(create)
	if phase, why := reason(); phase != api.PhaseCreateBackOff || why == "" {
		t.Fatalf("between tries: %s %q", phase, why)
	}
	if !r.acts.claim(create, r.acts.listEpoch()) {
		t.Fatal("claim the retry")
	}
	if phase, why := reason(); phase != api.PhaseContainerCreating || why == "" {
		t.Fatalf("during the retry: %s %q, want the last failure", phase, why)
	}
}

// A replica that never started (its image cannot be found) has a
// creation time from when this node first owned it, kept across passes
// (get replicas showed AGE <unknown> and creationTimestamp null); it is
// forgotten once the node no longer owns the replica.
func TestNeverStartedReplicaHasACreationTime(t *testing.T) {
	r := &replicas{self: "n1", rt: newFakeRuntime(), acts: newActions()}
	d := reconcile.Replica{ID: "default_web-1", Name: "web-1", Namespace: "default", Workload: "web", Ordinal: 1, SpecHash: "abc"}
	before := time.Now().Add(-time.Second)
	first := r.localReplicas(nil, []reconcile.Replica{d}, nil)[0].Created
	if first.Before(before) || first.After(time.Now()) {
		t.Fatalf("created %v, want about now", first)
	}
	time.Sleep(1100 * time.Millisecond)
	if again := r.localReplicas(nil, []reconcile.Replica{d}, nil)[0].Created; !again.Equal(first) {
		t.Fatalf("created moved from %v to %v between passes", first, again)
	}
	r.localReplicas(nil, []reconcile.Replica{}, nil) // no longer owned
	if len(r.waiting) != 0 {
		t.Fatalf("kept %v for a replica the node no longer owns", r.waiting)
	}
}
