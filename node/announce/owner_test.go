package announce

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

var (
	lbA = netip.MustParseAddr("192.168.222.240")
	lbB = netip.MustParseAddr("192.168.222.241")
)

func nodes(alive ...bool) []Node {
	var out []Node
	for i, up := range alive {
		out = append(out, Node{Name: string(rune('a' + i)), Alive: up, Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 22, byte(i + 1), 0}), 24)})
	}
	return out
}

// TestOwnerIsRendezvousOverLiveNodes: every node computes the same owner
// of an address from the same nodes, in any order; when it dies the next
// in rank takes the address and no other moves; with Local only nodes
// with a ready endpoint of the Service may own it.
func TestOwnerIsRendezvousOverLiveNodes(t *testing.T) {
	all := nodes(true, true, true)
	first := Owner(Address{Addr: lbA}, all)
	if first == "" {
		t.Fatal("no owner among three live nodes")
	}
	rev := slices.Clone(all)
	slices.Reverse(rev)
	if got := Owner(Address{Addr: lbA}, rev); got != first {
		t.Errorf("order changed the owner: %s, then %s", first, got)
	}
	down := slices.Clone(all)
	for i := range down {
		if down[i].Name == first {
			down[i].Alive = false
		}
	}
	second := Owner(Address{Addr: lbA}, down)
	if second == "" || second == first {
		t.Errorf("owner %s dead: next owner %q", first, second)
	}
	// Rendezvous: an address whose owner was not the dead node keeps it.
	for i := range 64 {
		a := Address{Addr: netip.AddrFrom4([4]byte{192, 168, 1, byte(i)})}
		if o := Owner(a, all); o != first && Owner(a, down) != o {
			t.Errorf("%v moved from %s, which is alive", a.Addr, o)
		}
	}
	local := Address{Addr: lbA, Local: true, Endpoints: []netip.Addr{netip.MustParseAddr("10.22.3.5")}}
	if got := Owner(local, all); got != "c" {
		t.Errorf("Local with one endpoint on c: owner %q", got)
	}
	if got := Owner(local, nodes(true, true, false)); got != "" {
		t.Errorf("Local with its endpoint's node dead: owner %q, want none", got)
	}
	if got := Owner(Address{Addr: lbA}, nodes(false, false)); got != "" {
		t.Errorf("no live node: owner %q", got)
	}
}

// TestMineNeedsAMajority: a node announces what it owns only while it
// counts a majority by its quorum questions and in its view; a reserved
// address (a node's own) never.
func TestMineNeedsAMajority(t *testing.T) {
	addrs := []Address{{Addr: lbA}, {Addr: lbB}}
	owners := map[netip.Addr]string{lbA: Owner(addrs[0], nodes(true, true, true)), lbB: Owner(addrs[1], nodes(true, true, true))}
	for _, c := range []struct {
		name     string
		nodes    []Node
		majority bool
		reserved map[netip.Addr]bool
		want     func(self string) []netip.Addr
	}{
		{name: "all up", nodes: nodes(true, true, true), majority: true, want: func(self string) []netip.Addr {
			var out []netip.Addr
			for _, a := range []netip.Addr{lbA, lbB} {
				if owners[a] == self {
					out = append(out, a)
				}
			}
			return out
		}},
		{name: "no quorum count", nodes: nodes(true, true, true), majority: false, want: func(string) []netip.Addr { return nil }},
		{name: "alone in its view of 3", nodes: nodes(true, false, false), majority: true, want: func(string) []netip.Addr { return nil }},
		{name: "2 of 4 is no majority", nodes: nodes(true, true, false, false), majority: true, want: func(string) []netip.Addr { return nil }},
		{name: "a node's address", nodes: nodes(true, true, true), majority: true, reserved: map[netip.Addr]bool{lbA: true, lbB: true},
			want: func(string) []netip.Addr { return nil }},
	} {
		for _, self := range []string{"a", "b", "c"} {
			got := Mine(Input{Self: self, Nodes: c.nodes, Addresses: addrs, Majority: c.majority, Reserved: c.reserved})
			if want := c.want(self); !slices.Equal(got, want) {
				t.Errorf("%s, node %s: %v, want %v", c.name, self, got, want)
			}
		}
	}
	// Exactly one node announces each address when all agree.
	count := map[netip.Addr]int{}
	for _, self := range []string{"a", "b", "c"} {
		for _, a := range Mine(Input{Self: self, Nodes: nodes(true, true, true), Addresses: addrs, Majority: true}) {
			count[a]++
		}
	}
	if count[lbA] != 1 || count[lbB] != 1 {
		t.Errorf("announcers per address: %v", count)
	}
}

// TestNextARP: a burst over 3 s, then one per interval.
func TestNextARP(t *testing.T) {
	t0 := time.Unix(0, 0)
	var got []time.Duration
	for n := range 7 {
		got = append(got, NextARP(t0, n, 30*time.Second).Sub(t0))
	}
	want := []time.Duration{250 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second, 33 * time.Second, 63 * time.Second, 93 * time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
}
