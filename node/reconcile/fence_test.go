package reconcile

import (
	"strings"
	"testing"
)

func stateful(hash string, ordinal int) Replica {
	return NewStatefulReplica("default", "db", hash, ordinal, Spec{Image: "db"})
}

func names(rs []Replica) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.Name)
	}
	return strings.Join(s, " ")
}

func TestFenceAtMostOne(t *testing.T) {
	db0, db1 := stateful("aaaaaaaa", 0), stateful("aaaaaaaa", 1)
	web := rep("web", "aaaaaaaa", 0)
	mine := []Replica{db0, db1, web}
	held1 := map[string]map[int]bool{"default/db": {1: true}}
	cases := []struct {
		name string
		in   Fencing
		want string
	}{
		{"quorum, nothing held: all run", Fencing{Quorum: true}, "db-0 db-1 web-aaaaaaaa-0"},
		{"no quorum: StatefulSet replicas stop, Deployments keep running", Fencing{Observed: []Container{running(db0)}}, "web-aaaaaaaa-0"},
		{"occupied elsewhere: wait", Fencing{Quorum: true, Occupied: held1}, "db-0 web-aaaaaaaa-0"},
		{"occupied elsewhere but running here: keep", Fencing{Quorum: true, Occupied: held1, Observed: []Container{running(db1)}}, "db-0 db-1 web-aaaaaaaa-0"},
		{"quorum unknown: keep what runs, start nothing", Fencing{Unknown: true, Observed: []Container{running(db1)}}, "db-1 web-aaaaaaaa-0"},
		{"exited here, occupied elsewhere (the watchdog killed it, a peer took over): wait", Fencing{Quorum: true, Occupied: held1, Observed: []Container{exited(db1)}}, "db-0 web-aaaaaaaa-0"},
		{"exited here, nowhere else: restart", Fencing{Quorum: true, Observed: []Container{exited(db1)}}, "db-0 db-1 web-aaaaaaaa-0"},
		{"quorum unknown, exited here: start nothing", Fencing{Unknown: true, Observed: []Container{exited(db1)}}, "web-aaaaaaaa-0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := names(Fence(mine, c.in)); got != c.want {
				t.Fatalf("Fence = %q, want %q", got, c.want)
			}
		})
	}
	// A StatefulSet replica that Gate keeps at its old spec (the update
	// waits) is still fenced.
	oldDb0 := stateful("00000000", 0)
	kept := Gate(Budget{Mine: []Replica{db0}, Observed: []Container{running(oldDb0)}, Ready: func(string) bool { return true },
		Strategies: map[string]Strategy{"default/db": {Replicas: 2, MaxUnavailable: 1, Reverse: true, Paused: true}}})
	if len(kept) != 1 || kept[0].SpecHash != "00000000" || !kept[0].AtMostOne {
		t.Fatalf("Gate kept %+v, want the old db-0 marked AtMostOne", kept)
	}
	if got := Fence(kept, Fencing{Observed: []Container{running(oldDb0)}}); len(got) != 0 {
		t.Fatalf("a kept old StatefulSet replica escaped fencing: %+v", got)
	}
	if !Majority(3, 5) || Majority(2, 4) || !Majority(1, 1) || Majority(2, 5) {
		t.Fatal("Majority must be strict")
	}
}

func TestStatefulReplicaUpdatesInPlaceHighestFirst(t *testing.T) {
	strat := Strategy{Replicas: 3, MaxUnavailable: 1, Reverse: true, Ordered: true}
	old0, old2 := stateful("aaaaaaaa", 0), stateful("aaaaaaaa", 2)
	new0, new2 := stateful("bbbbbbbb", 0), stateful("bbbbbbbb", 2)
	if new0.ID != old0.ID || new0.Name != "db-0" {
		t.Fatalf("a StatefulSet replica keeps its name and ID across specs: %s %s", new0.ID, old0.ID)
	}
	copies := []Copy{{Ordinal: 0, SpecHash: "aaaaaaaa", Ready: true}, {Ordinal: 1, SpecHash: "aaaaaaaa", Ready: true}, {Ordinal: 2, SpecHash: "aaaaaaaa", Ready: true}}
	in := Budget{
		Mine: []Replica{new0, new2}, Observed: []Container{running(old0), running(old2)},
		Ready:      func(string) bool { return true },
		Strategies: map[string]Strategy{"default/db": strat},
		Copies:     map[string][]Copy{"default/db": copies},
	}
	// Ordinal 2 goes first; ordinal 0 keeps its old spec.
	got := Gate(in)
	if len(got) != 2 || got[0].SpecHash != "aaaaaaaa" || got[1].SpecHash != "bbbbbbbb" {
		t.Fatalf("Gate = %+v", got)
	}
	res := Plan(got, in.Observed, t0)
	if len(res.Actions) != 1 || res.Actions[0].Type != Replace || res.Actions[0].Old.ID != old2.ID || res.Actions[0].Replica.SpecHash != "bbbbbbbb" {
		t.Fatalf("Plan = %+v, want one in-place Replace of db-2", res.Actions)
	}
	// OrderedReady: db-1 with no copy waits until db-0 is ready.
	db1 := stateful("bbbbbbbb", 1)
	in = Budget{Mine: []Replica{db1}, Ready: func(string) bool { return false },
		Strategies: map[string]Strategy{"default/db": strat},
		Copies:     map[string][]Copy{"default/db": {{Ordinal: 0, SpecHash: "bbbbbbbb"}}}}
	if got := Gate(in); len(got) != 0 {
		t.Fatalf("db-1 started before db-0 was ready: %+v", got)
	}
	in.Copies["default/db"][0].Ready = true
	if got := Gate(in); len(got) != 1 {
		t.Fatalf("db-1 should start once db-0 is ready: %+v", got)
	}
}

func exited(r Replica) Container {
	c := running(r)
	c.State = StateExited
	return c
}
