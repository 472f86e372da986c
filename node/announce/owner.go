// Package announce puts the LoadBalancer Services' LAN addresses on the
// LAN: for each address one live node, chosen by placement's rendezvous
// hashing over the nodes placement may use, adds it to its LAN interface
// and sends gratuitous ARP; every other node holds none of it. Who
// announces what is a pure function of the view, this node's quorum and
// the time (Mine); the Announcer applies it through a Link (lan.go:
// netlink and ARP), which tests replace.
//
// No coordinator: every node computes the same owner from the same view.
// When the owner dies or is cut off, the others' views drop it at
// failure detection and the next in rank announces at once (a view
// rebuild and a netlink call later). A node announces only while it
// counts a strict majority of the known nodes, both in its view (live
// members) and by its quorum questions (the StatefulSet fence's count),
// so under a partition only the majority side answers ARP; in a 2-node
// cluster that means no node announces while the two do not see each
// other (README, LoadBalancer Services).
package announce

import (
	"net/netip"
	"slices"
	"time"

	"github.com/starling-orchestrator/starling/placement"
)

// Address is one LoadBalancer address and what decides who may announce
// it.
type Address struct {
	Addr    netip.Addr
	Service string // "namespace/name"
	// Local is externalTrafficPolicy Local: only a node with a ready
	// endpoint of the Service (in its pod subnet) may announce it.
	Local     bool
	Endpoints []netip.Addr
}

// Node is a known node as the view holds it.
type Node struct {
	Name string
	// Alive: a live member placement may use (view.Eligible), this node
	// included unless it settles itself out (NodeStatus.SettleUntil).
	Alive  bool
	Subnet netip.Prefix // its pod subnet
}

// Input is what Mine decides from.
type Input struct {
	Self string
	// Nodes are every known node (the view's records), this one
	// included.
	Nodes     []Node
	Addresses []Address
	// Majority: this node counts a strict majority by its quorum
	// questions (the fence's count, with evidence younger than
	// --fence-timeout).
	Majority bool
	// Reserved are the nodes' own addresses: never announced, whatever a
	// record asks.
	Reserved map[netip.Addr]bool
}

// Owner returns the node that announces a among nodes: the first of
// placement.Rank over the live ones (those with a ready endpoint of a's
// Service, with Local), by the key "lb/<address>"; "" when none may.
func Owner(a Address, nodes []Node) string {
	var cands []placement.Node
	for _, n := range nodes {
		if !n.Alive || a.Local && !slices.ContainsFunc(a.Endpoints, n.Subnet.Contains) {
			continue
		}
		cands = append(cands, placement.Node{Name: n.Name})
	}
	if len(cands) == 0 {
		return ""
	}
	return placement.Rank(cands, "lb/"+a.Addr.String(), 0)[0]
}

// Mine returns the addresses this node announces, sorted: those it owns
// (Owner), but none while it lacks a majority, by its quorum count or
// among the known nodes of its view (live ones more than half of all).
func Mine(in Input) []netip.Addr {
	alive := 0
	for _, n := range in.Nodes {
		if n.Alive {
			alive++
		}
	}
	if !in.Majority || 2*alive <= len(in.Nodes) {
		return nil
	}
	var out []netip.Addr
	for _, a := range in.Addresses {
		if a.Addr.Is4() && !in.Reserved[a.Addr] && Owner(a, in.Nodes) == in.Self {
			out = append(out, a.Addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// Burst is when gratuitous ARPs go out after a node starts announcing an
// address, counted from then: at once and 4 more over 3 s (as MetalLB, which sends
// 5, 1.1 s apart), so LAN hosts that missed one switch within a second;
// after the last, one every Config.Interval.
var Burst = []time.Duration{0, 250 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second}

// NextARP returns when the gratuitous ARP after the n-th (0-based) of an
// address announced since since goes out.
func NextARP(since time.Time, n int, interval time.Duration) time.Time {
	if n+1 < len(Burst) {
		return since.Add(Burst[n+1])
	}
	return since.Add(Burst[len(Burst)-1] + time.Duration(n+2-len(Burst))*interval)
}
