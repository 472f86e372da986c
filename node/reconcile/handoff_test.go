package reconcile

import (
	"testing"
	"time"
)

func TestOwnedMakeBeforeBreak(t *testing.T) {
	a, b := rep("w", "aaaaaaaa", 0), rep("w", "aaaaaaaa", 1)
	base := Ownership{
		Self:     "n1",
		All:      []Replica{a, b},
		Owner:    ownerOf(map[string]string{a.ID: "n1", b.ID: "n2"}),
		Observed: []Container{running(a), running(b)},
		Now:      t0,
		Timeout:  time.Minute,
	}
	ids := func(rs []Replica) string {
		s := ""
		for _, r := range rs {
			s += r.Name + " "
		}
		return s
	}

	// b moved to n2, which is not ready yet: n1 keeps it and starts the clock.
	mine, h := Owned(base)
	if got := ids(mine); got != "w-aaaaaaaa-0 w-aaaaaaaa-1 " {
		t.Fatalf("mine = %q", got)
	}
	if !h[b.ID].Equal(t0) {
		t.Fatalf("handoff of b should start now, got %v", h)
	}

	// Still within the timeout: kept, clock unchanged.
	next := base
	next.HandoffSince, next.Now = h, t0.Add(30*time.Second)
	if mine, h2 := Owned(next); len(mine) != 2 || !h2[b.ID].Equal(t0) {
		t.Fatalf("within timeout: mine %q handoffs %v", ids(mine), h2)
	}

	// New owner ready: n1 lets go.
	ready := next
	ready.ReadyElsewhere = map[string]bool{b.ID: true}
	if mine, h2 := Owned(ready); ids(mine) != "w-aaaaaaaa-0 " || len(h2) != 0 {
		t.Fatalf("after ready: mine %q handoffs %v", ids(mine), h2)
	}

	// Timeout passed without readiness: n1 lets go too.
	late := next
	late.Now = t0.Add(61 * time.Second)
	if mine, _ := Owned(late); ids(mine) != "w-aaaaaaaa-0 " {
		t.Fatalf("after timeout: mine %q", ids(mine))
	}

	// A replica n1 never ran is not picked up for another owner.
	fresh := base
	fresh.Observed = []Container{running(a)}
	if mine, _ := Owned(fresh); ids(mine) != "w-aaaaaaaa-0 " {
		t.Fatalf("not running here: mine %q", ids(mine))
	}

	// A replica that fits nowhere is not kept.
	nowhere := base
	nowhere.Owner = ownerOf(map[string]string{a.ID: "n1", b.ID: ""})
	if mine, _ := Owned(nowhere); ids(mine) != "w-aaaaaaaa-0 " {
		t.Fatalf("unplaced: mine %q", ids(mine))
	}
}

// ownerOf is Ownership.Owner over a map of replica ID to node.
func ownerOf(m map[string]string) func(id string) string {
	return func(id string) string { return m[id] }
}
