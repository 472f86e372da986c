package view

import (
	"slices"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// Claims answers the arrival check's and the arbiter's questions from
// one immutable value: the claims overlapping a subnet (through the /24
// index, wide claims included), a node's held status, and whether a
// claim is still reserved (up, or a record younger than reclaimAfter).
func TestClaimsNearHeldAndReserved(t *testing.T) {
	now := time.Now()
	st := func(name, subnet string, wrote time.Time) NodeStatus {
		return NodeStatus{Name: name, PodSubnet: subnet, Version: hlc.Timestamp{Wall: wrote.UnixNano()}}
	}
	held := map[string]NodeStatus{
		"a":    st("a", "10.22.1.0/24", now),
		"b":    st("b", "10.22.2.0/24", now.Add(-2*time.Hour)),
		"c":    st("c", "10.22.2.16/28", now.Add(-time.Minute)),
		"wide": st("wide", "10.22.0.0/22", now),
		"none": st("none", "", now),
	}
	members := []gossip.Member{{Name: "a", State: gossip.StateAlive}, {Name: "b", State: gossip.StateDead}, {Name: "c", State: gossip.StateDead}}
	c := NewClaims(held, members)
	names := func(ss []NodeStatus) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.Name)
		}
		slices.Sort(out)
		return out
	}
	if got := names(c.Near(NodeStatus{Name: "x", PodSubnet: "10.22.2.0/24"})); !slices.Equal(got, []string{"b", "c", "wide"}) {
		t.Errorf("near 10.22.2.0/24: %v, want b, c and the wide claim", got)
	}
	if got := names(c.Near(NodeStatus{Name: "x", PodSubnet: "10.22.9.0/24"})); len(got) != 0 {
		t.Errorf("near 10.22.9.0/24: %v, want none", got)
	}
	if got := names(c.Near(NodeStatus{Name: "x", PodSubnet: "10.22.0.0/16"})); !slices.Equal(got, []string{"a", "b", "c", "wide"}) {
		t.Errorf("near a /16: %v, want every claim", got)
	}
	if _, ok := c.Held("none"); !ok {
		t.Error("a held status without a claim is not held")
	}
	for name, want := range map[string]bool{"a": true, "b": false, "c": true, "wide": true, "unknown": false} {
		if got := c.Reserved(name, time.Hour); got != want {
			t.Errorf("reserved(%s) = %v, want %v", name, got, want)
		}
	}
	// Nil claims (before the first view) hold nothing.
	var empty *Claims
	if len(empty.Near(held["a"])) != 0 || empty.Reserved("a", time.Hour) {
		t.Error("nil claims answer")
	}
	// A view's own unpublished status is shown by the view, not held.
	statuses := map[string]NodeStatus{"a": held["a"], "me": st("me", "10.22.1.0/24", now)}
	if _, ok := newClaims(statuses, map[string]NodeStatus{"a": held["a"]}, nil).Held("me"); ok {
		t.Error("the view's own unpublished status counts as held")
	}
}
