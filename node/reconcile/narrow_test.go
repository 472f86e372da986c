package reconcile

import (
	"maps"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The agent builds Decide's inputs for part of the cluster only
// (node/decision.go budgetInput, node/fence.go fencing): the rollout
// strategies and copies of the workloads whose replicas placement gives
// this node or whose containers run here, and the held ordinals of
// StatefulSets. That is sound only if Decide reads nothing else: over
// random clusters, with strategies, copies and held ordinals for every
// workload (several specs, copies on other nodes, ready or not), Decide
// on the narrowed inputs decides exactly what it decides on the full ones.
func TestDecideReadsOnlyTheWorkloadsItIsAskedAbout(t *testing.T) {
	// Ten clusters a check: the cases that tell (an owned StatefulSet
	// ordinal waiting on a lower one) are a few percent of draws.
	rapid.Check(t, func(rt *rapid.T) {
		for range 10 {
			decideNarrowed(rt)
		}
	})
}

// decideNarrowed draws one cluster and fails when Decide on the narrowed
// inputs differs from Decide on the full ones.
func decideNarrowed(rt *rapid.T) {
	workloads := []struct {
		name     string
		stateful bool
	}{{"db", true}, {"web", false}, {"api", false}, {"cache", true}}
	var all []Replica
	owner := map[string]string{}
	var observed []Container
	full := Budget{Strategies: map[string]Strategy{}, Copies: map[string][]Copy{}}
	held := map[string]map[int]bool{}
	stateful := map[string]bool{}
	ready := map[string]bool{}
	for _, w := range workloads {
		key := WorkloadKey("default", w.name)
		n := rapid.IntRange(1, 3).Draw(rt, "replicas "+w.name)
		full.Strategies[key] = Strategy{Replicas: n, MaxUnavailable: rapid.IntRange(0, 2).Draw(rt, "unavailable "+w.name),
			MaxSurge: rapid.IntRange(0, 1).Draw(rt, "surge "+w.name), Reverse: w.stateful, Ordered: w.name == "db" || w.stateful && rapid.Bool().Draw(rt, "ordered "+w.name)}
		stateful[key] = w.stateful
		held[key] = map[int]bool{}
		hashes := []string{"aaaaaaaa", "bbbbbbbb"}
		for i := range n {
			var r Replica
			if w.stateful {
				r = NewStatefulReplica("default", w.name, hashes[0], i, Spec{Image: w.name})
			} else {
				r = NewReplica("default", w.name, hashes[0], "", i, Spec{Image: w.name})
			}
			all = append(all, r)
			owner[r.ID] = rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "owner "+r.Name)
			if rapid.Bool().Draw(rt, "runs here "+r.Name) {
				// Maybe an older spec of it.
				old := r
				if rapid.Bool().Draw(rt, "old spec "+r.Name) {
					if w.stateful {
						old = NewStatefulReplica("default", w.name, hashes[1], i, Spec{Image: w.name + "-old"})
					} else {
						old = NewReplica("default", w.name, hashes[1], "", i, Spec{Image: w.name + "-old"})
					}
				}
				c := running(old)
				observed = append(observed, c)
				ready[c.ID] = rapid.Bool().Draw(rt, "ready here "+r.Name)
			}
			for _, node := range []string{"b", "c"} {
				if rapid.Bool().Draw(rt, "copy on "+node+" "+r.Name) {
					full.Copies[key] = append(full.Copies[key], Copy{Node: node, Ordinal: i,
						SpecHash: rapid.SampledFrom(hashes).Draw(rt, "copy spec"), Ready: rapid.Bool().Draw(rt, "copy ready")})
					held[key][i] = true
				}
			}
		}
	}
	for _, c := range observed {
		full.Copies[WorkloadKey(c.Namespace, c.Workload)] = append(full.Copies[WorkloadKey(c.Namespace, c.Workload)],
			Copy{Node: "a", Ordinal: c.Ordinal, SpecHash: c.SpecHash, Ready: ready[c.ID]})
	}
	full.Ready = func(id string) bool { return ready[id] }
	handoffs := map[string]time.Time{}
	for _, c := range observed {
		if rapid.Bool().Draw(rt, "handoff since "+c.Name) {
			handoffs[c.ID] = t0.Add(-time.Duration(rapid.IntRange(0, 120).Draw(rt, "handoff age")) * time.Second)
		}
	}
	readyElsewhere := map[string]bool{}
	for _, r := range all {
		readyElsewhere[r.ID] = owner[r.ID] != "a" && rapid.Bool().Draw(rt, "ready at its owner "+r.Name)
	}
	fencing := Fencing{Quorum: rapid.Bool().Draw(rt, "quorum"), Unknown: rapid.Bool().Draw(rt, "unknown"), Occupied: held}
	d := Decision{
		Ownership: Ownership{Self: "a", All: all, Owner: ownerOf(owner), Observed: observed, HandoffSince: handoffs, Now: t0, Timeout: time.Minute,
			ReadyElsewhere: readyElsewhere},
		Budget: full, Fencing: fencing, Stateful: stateful, StatefulGrace: 8 * time.Second,
	}

	// What the agent asks about: placement's replicas for this node,
	// and the containers here.
	asked := map[string]bool{}
	for _, r := range all {
		if owner[r.ID] == "a" {
			asked[WorkloadKey(r.Namespace, r.Workload)] = true
		}
	}
	for _, c := range observed {
		asked[WorkloadKey(c.Namespace, c.Workload)] = true
	}
	narrow := d
	narrow.Budget.Strategies = maps.Clone(full.Strategies)
	narrow.Budget.Copies = maps.Clone(full.Copies)
	maps.DeleteFunc(narrow.Budget.Strategies, func(k string, _ Strategy) bool { return !asked[k] })
	maps.DeleteFunc(narrow.Budget.Copies, func(k string, _ []Copy) bool { return !asked[k] })
	narrow.Fencing.Occupied = maps.Clone(held)
	maps.DeleteFunc(narrow.Fencing.Occupied, func(k string, _ map[int]bool) bool { return !stateful[k] })

	want, got := Decide(d, t0), Decide(narrow, t0)
	if names(got.Mine) != names(want.Mine) || actionsString(got.Actions) != actionsString(want.Actions) ||
		got.Fenced != want.Fenced || got.Requeue != want.Requeue || !maps.Equal(got.Handoffs, want.Handoffs) {
		rt.Fatalf("narrowed inputs decide otherwise:\n mine %q, actions %q\n full: mine %q, actions %q",
			names(got.Mine), actionsString(got.Actions), names(want.Mine), actionsString(want.Actions))
	}
}
