package view

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/test/harness"
)

// The view's desired replicas, built from each workload's cached
// expansion (AllReplicas), equal DesiredReplicas of every workload over
// random writes: scales, new images, deletions and new workloads, with
// names chosen so that IDs of different workloads interleave.
func TestAllReplicasFollowsEveryWrite(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	names := []string{"a", "a-b", "a-c", "ab", "b", "web", "web-1", "w"}
	objs := map[string]manifest.Object{}
	version := int64(0)
	recs := map[string]crdt.Record{}
	vs := NewBuilder(Config{})
	for step := range 300 {
		name := names[rng.IntN(len(names))]
		o := mustParse(t, harness.App{Name: name, Replicas: int32(rng.IntN(13)), Container: "c", Image: fmt.Sprintf("x:%d", rng.IntN(3))}.Deployment())
		version++
		b, err := manifest.Encode(o)
		if err != nil {
			t.Fatal(err)
		}
		rec := crdt.Record{Key: o.Key(), Value: b, Version: hlc.Timestamp{Wall: version}, Origin: "n"}
		if rng.IntN(5) == 0 {
			rec.Deleted, rec.Value = true, nil
			delete(objs, o.Key())
		} else {
			objs[o.Key()] = o
		}
		recs[o.Key()] = rec
		list := slices.SortedFunc(maps.Values(recs), func(a, b crdt.Record) int { return strings.Compare(a.Key, b.Key) })
		decoded := vs.DecodeObjects(list, map[string]bool{})
		var got []reconcile.Replica
		for _, d := range vs.AllReplicas(list) {
			got = append(got, d.Replica())
		}
		want := DesiredReplicas(decoded)
		if len(decoded) != len(objs) {
			t.Fatalf("step %d: decoded %d objects, want %d", step, len(decoded), len(objs))
		}
		if len(got) != len(want) || len(got) > 0 && !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: allReplicas gives %d replicas, desiredReplicas %d", step, len(got), len(want))
		}
	}
}

// reconcile.Owned given only a view's candidates for a node (what
// placement gives it and the replicas of its containers) decides what it
// decides given every desired replica, over random placements,
// containers and handoffs.
func TestCandidatesDecideAsEveryReplica(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	nodes := []string{"self", "a", "b", ""}
	for step := range 500 {
		var all []reconcile.Replica
		for w := range 1 + rng.IntN(4) {
			for ord := range rng.IntN(6) {
				r := reconcile.NewReplica("default", fmt.Sprintf("w%d", w), "aaaaaaaa", "", ord, reconcile.Spec{})
				if rng.IntN(4) == 0 {
					r = reconcile.NewStatefulReplica("default", fmt.Sprintf("s%d", w), "bbbbbbbb", ord, reconcile.Spec{})
				}
				all = append(all, r)
			}
		}
		slices.SortFunc(all, func(a, b reconcile.Replica) int { return strings.Compare(a.ID, b.ID) })
		all = slices.CompactFunc(all, func(a, b reconcile.Replica) bool { return a.ID == b.ID })
		owner := map[string]string{}
		ready, since := map[string]bool{}, map[string]time.Time{}
		var observed []reconcile.Container
		now := time.Unix(1000, 0)
		for _, r := range all {
			owner[r.ID] = nodes[rng.IntN(len(nodes))]
			if rng.IntN(2) == 0 {
				observed = append(observed, reconcile.Container{ID: r.ID, Name: r.Name, Namespace: r.Namespace, Workload: r.Workload,
					Ordinal: r.Ordinal, State: reconcile.StateRunning})
			}
			ready[r.ID] = rng.IntN(3) == 0
			if rng.IntN(3) == 0 {
				since[r.ID] = now.Add(-time.Duration(rng.IntN(90)) * time.Second)
			}
		}
		observed = append(observed, reconcile.Container{ID: "default_gone-0", Name: "gone-0", Namespace: "default", State: reconcile.StateRunning})
		v := &View{All: compact(all), Owner: tableOf(compact(all), owner)}
		in := reconcile.Ownership{Self: "self", All: all, Owner: ownerOf(owner), Observed: observed, ReadyElsewhere: ready,
			HandoffSince: since, Now: now, Timeout: time.Minute}
		wantMine, wantHandoffs := reconcile.Owned(in)
		in.All = v.Candidates("self", observed)
		gotMine, gotHandoffs := reconcile.Owned(in)
		if !slices.EqualFunc(gotMine, wantMine, func(a, b reconcile.Replica) bool { return a.ID == b.ID }) || !maps.Equal(gotHandoffs, wantHandoffs) {
			t.Fatalf("step %d: from the candidates Owned gives %d replicas and %v, from every replica %d and %v",
				step, len(gotMine), gotHandoffs, len(wantMine), wantHandoffs)
		}
	}
}

// compact is rs as a view holds them (DesiredReplica), each with a
// template of its own.
func compact(rs []reconcile.Replica) []DesiredReplica {
	out := make([]DesiredReplica, len(rs))
	for i, r := range rs {
		t := r
		out[i] = DesiredReplica{ReplicaRef{r.ID, r.Name, r.Ordinal}, &t}
	}
	return out
}

// ownerOf is an owner lookup over a map of replica ID to node.
func ownerOf(m map[string]string) func(id string) string {
	return func(id string) string { return m[id] }
}

// tableOf is the OwnerTable of all by owner (replica ID -> node).
func tableOf(all []DesiredReplica, owner map[string]string) OwnerTable {
	t := OwnerTable{All: all, Node: make([]string, len(all))}
	for i, d := range all {
		t.Node[i] = owner[d.Id]
	}
	return t
}

func TestReadyAtOwnerCountsOnlyTheNewOwnersCopy(t *testing.T) {
	r := reconcile.NewReplica("default", "w", "aaaaaaaa", "", 0, reconcile.Spec{})
	running := api.Replica{Name: r.Name, Namespace: "default", Phase: api.PhaseRunning, Ready: true}
	statuses := map[string]NodeStatus{
		"a": {Name: "a", Replicas: []api.Replica{running}},
		"b": {Name: "b", Replicas: []api.Replica{running}},
		"c": {Name: "c"},
	}
	alive := map[string]bool{"a": true, "b": true, "c": true}
	stale := map[string]bool{}
	counts := func(n string) bool { return alive[n] && !stale[n] }
	owner := map[string]string{r.ID: "c"}
	observed := []reconcile.Container{{ID: r.ID, Name: r.Name, Namespace: "default", State: reconcile.StateRunning}}
	// a and b both run an old copy: neither may count it as the new one.
	if got := ReadyAtOwner("a", counts, statuses, ownerOf(owner), observed); got[r.ID] {
		t.Fatal("b's old copy counted as the new owner's")
	}
	statuses["c"] = NodeStatus{Name: "c", Replicas: []api.Replica{running}}
	if got := ReadyAtOwner("a", counts, statuses, ownerOf(owner), observed); !got[r.ID] {
		t.Fatal("the new owner's ready copy was not counted")
	}
	// A container without its name label (only its ID) is matched by ID.
	unlabelled := []reconcile.Container{{ID: r.ID, State: reconcile.StateRunning}}
	if got := ReadyAtOwner("a", counts, statuses, ownerOf(owner), unlabelled); !got[r.ID] {
		t.Fatal("the new owner's ready copy was not counted for a container without labels")
	}
	// A dead owner, this node as the owner, or no owner: nothing counts.
	alive["c"] = false
	if got := ReadyAtOwner("a", counts, statuses, ownerOf(owner), observed); got[r.ID] {
		t.Fatal("a dead owner's copy counted")
	}
	alive["c"] = true
	// The owner back from a crash, held with the record its earlier run
	// wrote: the copy it lists may have died with it.
	stale["c"] = true
	if got := ReadyAtOwner("a", counts, statuses, ownerOf(owner), observed); got[r.ID] {
		t.Fatal("a copy in a record of the owner's earlier run counted")
	}
	stale["c"] = false
	if got := ReadyAtOwner("c", counts, statuses, ownerOf(owner), observed); got[r.ID] {
		t.Fatal("this node's own copy counted as another owner's")
	}
	if got := ReadyAtOwner("a", counts, statuses, ownerOf(map[string]string{}), observed); got[r.ID] {
		t.Fatal("a copy counted for a replica without an owner")
	}
}
