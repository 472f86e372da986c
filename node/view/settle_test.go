package view

import (
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// TestANodeThatSettlesItselfIsLeftOutByEveryPeer: n3 is back from down;
// n2 held it dead (its flap damping leaves n3 out for the settle), n1
// only suspected it and counts it. n3 learned n2's verdict and says so
// in its record: n1 leaves it out too, so n1 and n2 place n3's replicas
// alike (before, n1 placed them on n3, which ran none, while n2 started
// them elsewhere: n3's copies ran beside their replacements for the whole
// settle, TestNodeBackAtANewAddress). n3 counts again at the time its
// record gives, capped at one settle after the record was written; and
// the view rebuilds at that time, with no record or membership change.
func TestANodeThatSettlesItselfIsLeftOutByEveryPeer(t *testing.T) {
	const settle = 10 * time.Second
	now := time.Unix(1e9, 0)
	written := hlc.Timestamp{Wall: now.Add(-2 * time.Second).UnixNano()}
	alive := map[string]bool{"n1": true, "n2": true, "n3": true} // n1's flap damping: n3 never dead
	status := func(until time.Time) map[string]NodeStatus {
		st := map[string]NodeStatus{}
		for name := range alive {
			st[name] = NodeStatus{Name: name, SubnetReady: true, Version: written}
		}
		s := st["n3"]
		s.SettleUntil = until
		st["n3"] = s
		return st
	}
	eligible := func(a map[string]bool, st map[string]NodeStatus) []string {
		var names []string
		for _, n := range eligibleNodes(a, st, alive) {
			names = append(names, n.Name)
		}
		return names
	}

	st := status(now.Add(5 * time.Second))
	out, next := SettlingOut(alive, st, "n1", now, settle)
	if got := eligible(out, st); len(got) != 2 || got[0] != "n1" || got[1] != "n2" {
		t.Fatalf("eligible with n3 settling itself: %v, want [n1 n2]", got)
	}
	if !next.Equal(now.Add(5 * time.Second)) {
		t.Fatalf("counts again at %v, want %v", next, now.Add(5*time.Second))
	}
	if !alive["n3"] {
		t.Fatal("the alive set given was modified")
	}
	if out, _ := SettlingOut(alive, st, "n3", now, settle); !out["n3"] {
		t.Fatal("a node's own record left it out of its own view (its flap damping decides that)")
	}
	if out, next := SettlingOut(alive, st, "n1", now.Add(5*time.Second), settle); !out["n3"] || !next.IsZero() {
		t.Fatalf("at its time n3 still left out (%v) or a later time given (%v)", out, next)
	}
	// An hour asked: capped at one settle after the record was written.
	st = status(now.Add(time.Hour))
	if _, next := SettlingOut(alive, st, "n1", now, settle); !next.Equal(now.Add(8 * time.Second)) {
		t.Fatalf("an hour asked: counts again at %v, want the write + settle %v", next, now.Add(8*time.Second))
	}
	if out, _ := SettlingOut(alive, status(time.Time{}), "n1", now, settle); len(out) != 3 {
		t.Fatalf("no settle asked: %v", out)
	}

	// The view rebuilds when n3 counts again.
	vs := NewBuilder(Config{Self: "n1", Acks: NewAckTracker(time.Minute), Damping: fixedDamping{}, Membership: noMembers{}})
	v := &View{settleAt: now.Add(5 * time.Second)}
	if vs.timeInputsChanged(v, now.Add(4*time.Second)) {
		t.Fatal("rebuild before n3 counts again")
	}
	if !vs.timeInputsChanged(v, now.Add(5*time.Second)) {
		t.Fatal("no rebuild when n3 counts again")
	}
}

type fixedDamping struct{}

func (fixedDamping) AliveAfter(_ time.Time, _ []gossip.Member, prev *Alive) (Alive, bool) {
	return *prev, true
}
func (fixedDamping) IsSynced() bool { return true }

type noMembers struct{}

func (noMembers) Members() []gossip.Member { return nil }
func (noMembers) Changed() <-chan struct{} { return nil }
