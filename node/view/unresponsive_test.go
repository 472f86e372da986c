package view

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/placement"
	"github.com/starling-orchestrator/starling/test/harness"
)

// TestUnreportedFindsNodesThatDoNotListTheirReplicas: a node that lists
// none of the slots placed on it is unreported; one that lists the
// slot's replica of another spec (a rolling update holding the new one
// back) is not, nor one that lists some of its slots but not all (its
// view lags); StatefulSet replicas never count.
func TestUnreportedFindsNodesThatDoNotListTheirReplicas(t *testing.T) {
	all := []reconcile.Replica{
		{ID: "default_web-1", Name: "web-new-0", Namespace: "default", Workload: "web", Ordinal: 0},
		{ID: "default_web-2", Name: "web-new-1", Namespace: "default", Workload: "web", Ordinal: 1},
		{ID: "default_web-3", Name: "web-new-2", Namespace: "default", Workload: "web", Ordinal: 2},
		{ID: "default_api-0", Name: "api-0", Namespace: "default", Workload: "api", Ordinal: 0},
		{ID: "default_db-0", Name: "db-0", Namespace: "default", Workload: "db", Ordinal: 0},
		{ID: "default_ss-0", Name: "ss-0", Namespace: "default", Workload: "ss", AtMostOne: true},
		{ID: "default_ss-1", Name: "ss-1", Namespace: "default", Workload: "ss", Ordinal: 1, AtMostOne: true},
	}
	owner := map[string]string{"default_web-1": "a", "default_web-2": "fake", "default_web-3": "c", "default_api-0": "c",
		"default_db-0": "b", "default_ss-0": "a", "default_ss-1": "d"}
	statuses := map[string]NodeStatus{
		"a":    {Replicas: []api.Replica{{Name: "web-old-0", Namespace: "default", Workload: "web", Ordinal: 0, Phase: api.PhaseRunning}}},
		"b":    {Replicas: []api.Replica{{Name: "db-0", Namespace: "other", Workload: "db", Ordinal: 0}}}, // another namespace's
		"c":    {Replicas: []api.Replica{{Name: "api-0", Namespace: "default", Workload: "api", Phase: api.PhasePending}}},
		"d":    {},
		"fake": {Replicas: []api.Replica{{Name: "ghost-0", Namespace: "default", Workload: "ghost", Phase: api.PhaseRunning}}},
	}
	p := placement.Placement{Owners: map[string][]string{}}
	for _, r := range all {
		key := reconcile.WorkloadKey(r.Namespace, r.Workload)
		for len(p.Owners[key]) <= r.Ordinal {
			p.Owners[key] = append(p.Owners[key], "")
		}
		p.Owners[key][r.Ordinal] = owner[r.ID]
	}
	got := unreported(givenSlots(compact(all), p), statuses)
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
	tr := NewAckTracker(30 * time.Second)
	fake := map[string]bool{"fake": true}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	if x := tr.observe(at(0), fake, 1); len(x) != 0 {
		t.Fatal("excluded at first sight")
	}
	if x := tr.observe(at(20*time.Second), map[string]bool{}, 1); len(x) != 0 {
		t.Fatal("excluded after listing")
	}
	tr.observe(at(25*time.Second), fake, 1) // the clock starts again
	if x := tr.observe(at(50*time.Second), fake, 1); len(x) != 0 {
		t.Fatal("excluded before the timeout")
	}
	x := tr.observe(at(56*time.Second), fake, 1)
	if len(x) != 1 || x[0].node != "fake" || x[0].for_ != 30*time.Second {
		t.Fatalf("first exclusion = %+v", x)
	}
	if !tr.excluded(at(80 * time.Second))["fake"] || tr.excluded(at(87 * time.Second))["fake"] {
		t.Fatal("exclusion does not last exactly 30s")
	}
	tr.observe(at(87*time.Second), fake, 1)
	x = tr.observe(at(118*time.Second), fake, 1)
	if len(x) != 1 || x[0].for_ != 60*time.Second {
		t.Fatalf("second exclusion = %+v, want 60s", x)
	}
	// At most limit nodes out at once.
	many := map[string]bool{"x": true, "y": true, "z": true}
	tr2 := NewAckTracker(30 * time.Second)
	tr2.observe(t0, many, 1)
	if x := tr2.observe(t0.Add(time.Minute), many, 1); len(x) != 1 || x[0].node != "x" {
		t.Fatalf("with limit 1: %+v", x)
	}
	if x := tr2.observe(t0.Add(70*time.Second), many, 1); len(x) != 0 {
		t.Fatalf("a second node left out while one is: %+v", x)
	}
	// Again and again at once: doubling up to maxExclusion, and staying
	// there (the memory of strikes counts from the end of an exclusion).
	now := at(200 * time.Second)
	var got []time.Duration
	for i := 0; i < 8; i++ {
		tr.observe(now, fake, 1)
		now = now.Add(31 * time.Second)
		x := tr.observe(now, fake, 1)
		if len(x) != 1 {
			t.Fatalf("strike %d: %+v", i, x)
		}
		got = append(got, x[0].for_)
		now = now.Add(x[0].for_)
	}
	want := []time.Duration{2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 10 * time.Minute, 10 * time.Minute, 10 * time.Minute, 10 * time.Minute, 10 * time.Minute}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("exclusions %v, want %v", got, want)
	}
	for i := 0; i < 8; i++ {
		now := now.Add(time.Duration(700+i*700) * time.Second)
		tr.observe(now, fake, 1)
		x = tr.observe(now.Add(31*time.Second), fake, 1)
	}
	if len(x) != 1 || x[0].for_ != 30*time.Second {
		t.Fatalf("after %s without exclusions the backoff should restart: %+v", strikeMemory, x)
	}
}

// TestPlaceLeavesExcludedNodesOutOfDeploymentsOnly: a node left out for
// not listing its replicas owns no Deployment replica, but keeps the
// StatefulSet replicas placement gives it (at most one copy: they never
// move off a live node on one node's judgement).
func TestPlaceLeavesExcludedNodesOutOfDeploymentsOnly(t *testing.T) {
	web := harness.App{Name: "web", Replicas: 12, Container: "c", Image: "img"}
	db := harness.App{Name: "db", Replicas: 12, Container: "c", Image: "img"}
	objs, err := manifest.Parse([]byte(harness.Manifests(web.Deployment(), db.StatefulSet("db"))), "test")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []placement.Node
	for _, n := range []string{"a", "b", "fake"} {
		nodes = append(nodes, placement.Node{Name: n, Allocatable: placement.Resources{MilliCPU: 64000, MemoryBytes: 1 << 40}})
	}
	all := DesiredReplicas(objs)
	p, _ := assign(nodes, objs, nil, nil)
	_, before := place(p, p, nodes, objs, compact(all), nil, nil, nil)
	ex := map[string]bool{"fake": true}
	p, without := assign(nodes, objs, ex, nil)
	kept, after := place(p, without, nodes, objs, compact(all), ex, nil, nil)
	if base := Owners(compact(all), kept); !slices.Equal(base.Node, before.Node) {
		t.Fatal("the base placement depends on exclusions")
	}
	var fakeDB, fakeWeb int
	for _, r := range all {
		if after.Of(r.ID) == "fake" {
			if r.AtMostOne {
				fakeDB++
			} else {
				fakeWeb++
			}
		}
		if r.AtMostOne && after.Of(r.ID) != before.Of(r.ID) {
			t.Errorf("StatefulSet replica %s moved from %s to %s", r.Name, before.Of(r.ID), after.Of(r.ID))
		}
	}
	if fakeWeb != 0 || fakeDB == 0 {
		t.Fatalf("the excluded node owns %d Deployment and %d StatefulSet replicas; want none and some", fakeWeb, fakeDB)
	}
}
