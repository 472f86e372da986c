package reconcile

import (
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestStepForFollowsOrdinalOrderAndBudget(t *testing.T) {
	const cur, old = "bbbbbbbb", "aaaaaaaa"
	rolling := func(n, u, s int) Strategy { return Strategy{Replicas: n, MaxUnavailable: u, MaxSurge: s} }
	// copies builds a cluster view: one letter per ordinal.
	//   o: old ready   n: current ready   p: current not ready (pending)
	//   b: old ready + current ready (surge finished, old not yet gone)
	//   s: old ready + current not ready (surging)
	//   x: nothing ready (old not ready)   -: no copy at all
	copies := func(s string) []Copy {
		var cs []Copy
		for i, ch := range s {
			switch ch {
			case 'o':
				cs = append(cs, Copy{Ordinal: i, SpecHash: old, Ready: true})
			case 'n':
				cs = append(cs, Copy{Ordinal: i, SpecHash: cur, Ready: true})
			case 'p':
				cs = append(cs, Copy{Ordinal: i, SpecHash: cur})
			case 'b':
				cs = append(cs, Copy{Ordinal: i, SpecHash: old, Ready: true}, Copy{Ordinal: i, SpecHash: cur, Ready: true})
			case 's':
				cs = append(cs, Copy{Ordinal: i, SpecHash: old, Ready: true}, Copy{Ordinal: i, SpecHash: cur})
			case 'x':
				cs = append(cs, Copy{Ordinal: i, SpecHash: old})
			}
		}
		return cs
	}
	cases := []struct {
		name     string
		s        Strategy
		ordinal  int
		oldReady bool
		view     string
		want     Step
	}{
		{"first ordinal goes first", rolling(6, 1, 0), 0, true, "oooooo", StepReplace},
		{"second waits for the first", rolling(6, 1, 0), 1, true, "oooooo", StepWait},
		{"second goes once the first is done", rolling(6, 1, 0), 1, true, "nooooo", StepReplace},
		{"first not ready yet blocks the second", rolling(6, 1, 0), 1, true, "pooooo", StepWait},
		{"old copy still there is not done", rolling(6, 1, 0), 1, true, "booooo", StepWait},
		{"two at a time with maxUnavailable 2", rolling(6, 2, 0), 1, true, "pooooo", StepReplace},
		{"third waits with maxUnavailable 2", rolling(6, 2, 0), 2, true, "ppoooo", StepWait},
		{"an unrelated crash spends the budget", rolling(6, 1, 0), 0, true, "oooxoo", StepWait},
		{"a dead node's ordinal spends the budget", rolling(6, 1, 0), 0, true, "ooo-oo", StepWait},
		{"surge first", rolling(6, 0, 1), 0, true, "oooooo", StepSurge},
		{"surge one at a time", rolling(6, 0, 1), 1, true, "boooo", StepWait},
		{"surge next once done", rolling(6, 0, 1), 1, true, "nooooo", StepSurge},
		{"surge and unavailable 2: replace beside a surge", rolling(6, 2, 1), 1, true, "sooooo", StepReplace},
		{"one at a time with surge 1 and unavailable 1", rolling(6, 1, 1), 1, true, "sooooo", StepWait},
		{"surge 2 surges two", rolling(6, 0, 2), 1, true, "sooooo", StepSurge},
		{"a not-ready old copy is replaced without spending the budget", rolling(6, 1, 0), 1, false, "nxoxoo", StepReplace},
		{"a not-ready old copy still waits for its turn", rolling(6, 1, 0), 5, false, "pooooo", StepWait},
		{"after an agent restart (nothing ready yet) only the first goes", rolling(6, 1, 0), 2, false, "oxxxxx", StepWait},
		{"paused holds even a not-ready old copy", Strategy{Replicas: 6, MaxUnavailable: 1, Paused: true}, 0, false, "xooooo", StepWait},
		{"paused waits", Strategy{Replicas: 6, MaxUnavailable: 1, Paused: true}, 0, true, "oooooo", StepWait},
		{"recreate stops first", Strategy{Replicas: 6, Recreate: true}, 3, true, "oooooo", StepStop},
		{"copies beyond replicas are ignored", rolling(2, 1, 0), 1, true, "nooo", StepReplace},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := StepFor(c.s, cur, c.ordinal, c.oldReady, copies(c.view)); got != c.want {
				t.Fatalf("StepFor(ordinal %d, view %q) = %s, want %s", c.ordinal, c.view, got, c.want)
			}
		})
	}
}

func TestGateKeepsOldCopiesAsDecided(t *testing.T) {
	oldA, newA := rep("w", "aaaaaaaa", 0), rep("w", "bbbbbbbb", 0)
	oldB, newB := rep("w", "aaaaaaaa", 1), rep("w", "bbbbbbbb", 1)
	ready := map[string]bool{}
	in := Budget{
		Mine:       []Replica{newA, newB},
		Observed:   []Container{running(oldA), running(oldB)},
		Ready:      func(id string) bool { return ready[id] },
		Strategies: map[string]Strategy{"default/w": {Replicas: 2, MaxUnavailable: 1}},
		Copies: map[string][]Copy{"default/w": {
			{Ordinal: 0, SpecHash: "aaaaaaaa", Ready: true}, {Ordinal: 1, SpecHash: "aaaaaaaa", Ready: true}}},
	}
	ready[oldA.ID], ready[oldB.ID] = true, true
	// Ordinal 0 is replaced (Plan pairs the removal of oldA with newA),
	// ordinal 1 waits.
	if got := names(Gate(in)); got != "w-aaaaaaaa-1 w-bbbbbbbb-0" {
		t.Fatalf("Gate = %q", got)
	}
	res := Plan(Gate(in), in.Observed, t0)
	if len(res.Actions) != 1 || res.Actions[0].Type != Replace || res.Actions[0].Old.ID != oldA.ID {
		t.Fatalf("Plan = %+v, want one Replace of ordinal 0", res.Actions)
	}

	// maxSurge 1, maxUnavailable 0: ordinal 0 surges (both kept), and
	// keeps its old copy until the new one is ready.
	in.Strategies["default/w"] = Strategy{Replicas: 2, MaxSurge: 1}
	if got := names(Gate(in)); got != "w-aaaaaaaa-0 w-aaaaaaaa-1 w-bbbbbbbb-0" {
		t.Fatalf("surge Gate = %q", got)
	}
	in.Observed = append(in.Observed, running(newA))
	if got := names(Gate(in)); got != "w-aaaaaaaa-0 w-aaaaaaaa-1 w-bbbbbbbb-0" {
		t.Fatalf("surge, new not ready: Gate = %q", got)
	}
	ready[newA.ID] = true
	if got := names(Gate(in)); got != "w-aaaaaaaa-1 w-bbbbbbbb-0" {
		t.Fatalf("surge, new ready: Gate = %q", got)
	}

	// Recreate: every old copy stops, and no new one starts while an old
	// one runs anywhere.
	in = Budget{Mine: []Replica{newA, newB}, Observed: []Container{running(oldA)}, Ready: func(string) bool { return true },
		Strategies: map[string]Strategy{"default/w": {Replicas: 2, Recreate: true}},
		Copies: map[string][]Copy{"default/w": {
			{Ordinal: 0, SpecHash: "aaaaaaaa", Ready: true}, {Ordinal: 1, SpecHash: "aaaaaaaa", Ready: true, Node: "n2"}}}}
	if got := names(Gate(in)); got != "" {
		t.Fatalf("Recreate with old copies left: Gate = %q, want nothing", got)
	}
	in.Observed, in.Copies["default/w"] = nil, nil
	if got := names(Gate(in)); got != "w-bbbbbbbb-0 w-bbbbbbbb-1" {
		t.Fatalf("Recreate once the old copies are gone: Gate = %q", got)
	}

	// A change of replicas alone: the spec is the same, nothing to gate.
	in = Budget{Mine: []Replica{oldA}, Observed: []Container{running(oldA)}, Ready: func(string) bool { return true },
		Strategies: map[string]Strategy{"default/w": {Replicas: 5, MaxUnavailable: 1}}}
	if got := names(Gate(in)); got != "w-aaaaaaaa-0" {
		t.Fatalf("same spec: Gate = %q", got)
	}
}

// simCopy is one container in the rollout simulation.
type simCopy struct {
	hash        string
	readyAt     int // tick it passes readiness (if not terminating)
	terminating bool
	goneAt      int // tick it is removed (terminating only)
}

// TestRolloutNeverExceedsBudgetWithStaleViews simulates a rolling update
// across nodes that each decide for their own ordinals from views up to
// `stale` ticks old, with random create, readiness and stop times. The
// true state must never have fewer than replicas-maxUnavailable ordinals
// with a ready copy, nor more than replicas+maxSurge copies, and the
// update must finish.
func TestRolloutNeverExceedsBudgetWithStaleViews(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 10).Draw(t, "replicas")
		nodes := rapid.IntRange(1, 4).Draw(t, "nodes")
		u := rapid.IntRange(0, 3).Draw(t, "maxUnavailable")
		s := rapid.IntRange(0, 3).Draw(t, "maxSurge")
		if u == 0 && s == 0 {
			u = 1
		}
		stale := rapid.IntRange(0, 6).Draw(t, "stale")
		strat := Strategy{Replicas: n, MaxUnavailable: u, MaxSurge: s}
		const oldH, curH = "aaaaaaaa", "bbbbbbbb"
		copies := make([][]simCopy, n)
		pendingCreate := make([]int, n) // tick a Replace's new copy appears (0: none)
		for i := range copies {
			copies[i] = []simCopy{{hash: oldH}}
		}
		owner := func(ord int) string { return fmt.Sprintf("n%d", ord%nodes) }
		view := func(tick int) []Copy {
			var out []Copy
			for ord, cs := range copies {
				for _, c := range cs {
					out = append(out, Copy{Node: owner(ord), Ordinal: ord, SpecHash: c.hash, Ready: !c.terminating && c.readyAt <= tick})
				}
			}
			return out
		}
		var history [][]Copy
		done := func() bool {
			for _, cs := range copies {
				if len(cs) != 1 || cs[0].hash != curH || cs[0].terminating {
					return false
				}
			}
			return true
		}
		for tick := 1; tick < 5000 && !done(); tick++ {
			// Time passes: stops finish, delayed creates appear.
			for ord := range copies {
				kept := copies[ord][:0]
				for _, c := range copies[ord] {
					if !c.terminating || c.goneAt > tick {
						kept = append(kept, c)
					}
				}
				copies[ord] = kept
				if pendingCreate[ord] != 0 && pendingCreate[ord] <= tick {
					copies[ord] = append(copies[ord], simCopy{hash: curH, readyAt: tick + rapid.IntRange(1, 5).Draw(t, "ready")})
					pendingCreate[ord] = 0
				}
			}
			// The truth must respect the budget.
			now := view(tick)
			readyOrds, total := map[int]bool{}, 0
			for _, c := range now {
				total++
				if c.Ready {
					readyOrds[c.Ordinal] = true
				}
			}
			if len(readyOrds) < n-u {
				t.Fatalf("tick %d: %d ordinals ready, budget allows no fewer than %d: %+v", tick, len(readyOrds), n-u, copies)
			}
			if total > n+s {
				t.Fatalf("tick %d: %d copies exist, budget allows at most %d: %+v", tick, total, n+s, copies)
			}
			history = append(history, now)

			// One node acts on a stale view of the others and a fresh view
			// of its own containers.
			self := fmt.Sprintf("n%d", rapid.IntRange(0, nodes-1).Draw(t, "node"))
			past := history[max(0, len(history)-1-rapid.IntRange(0, stale).Draw(t, "age"))]
			var seen []Copy
			for _, c := range past {
				if c.Node != self {
					seen = append(seen, c)
				}
			}
			var mine []Replica
			var observed []Container
			ready := map[string]bool{}
			for ord, cs := range copies {
				if owner(ord) != self {
					continue
				}
				mine = append(mine, rep("w", curH, ord))
				for _, c := range cs {
					ct := running(rep("w", c.hash, ord))
					observed = append(observed, ct)
					ready[ct.ID] = !c.terminating && c.readyAt <= tick
					seen = append(seen, Copy{Node: self, Ordinal: ord, SpecHash: c.hash, Ready: ready[ct.ID]})
				}
			}
			want := Gate(Budget{Mine: mine, Observed: observed, Ready: func(id string) bool { return ready[id] },
				Strategies: map[string]Strategy{"default/w": strat}, Copies: map[string][]Copy{"default/w": seen}})
			for _, a := range Plan(want, observed, t0).Actions {
				ord := a.Replica.Ordinal
				if a.Type == Remove {
					ord = a.Old.Ordinal
				}
				stop := func(hash string) int {
					for k := range copies[ord] {
						if c := &copies[ord][k]; c.hash == hash && !c.terminating {
							c.terminating, c.goneAt = true, tick+rapid.IntRange(1, 3).Draw(t, "stop")
							return c.goneAt
						}
					}
					return 0
				}
				switch a.Type {
				case Remove:
					stop(a.Old.SpecHash)
				case Replace:
					// Stop, then create once the old one is gone (one action).
					if pendingCreate[ord] == 0 {
						if gone := stop(a.Old.SpecHash); gone != 0 {
							pendingCreate[ord] = gone
						}
					}
				case Create:
					if pendingCreate[ord] == 0 {
						copies[ord] = append(copies[ord], simCopy{hash: curH, readyAt: tick + rapid.IntRange(1, 5).Draw(t, "ready")})
					}
				}
			}
		}
		if !done() {
			var b strings.Builder
			for ord, cs := range copies {
				fmt.Fprintf(&b, "%d:%+v ", ord, cs)
			}
			t.Fatalf("rollout did not finish: %s", b.String())
		}
	})
}
