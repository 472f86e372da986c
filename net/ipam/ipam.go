// Package ipam decides, with no master, which /24 of the cluster CIDR each
// node owns. A node claims a subnet by publishing it, with the hybrid
// logical clock time of the claim, in its gossiped node record. Every node
// resolves a conflict the same way: the earlier claim wins, then the lower
// node name; the loser claims another subnet before it runs any pod.
//
// Everything here is pure: the agent feeds it the records it holds.
package ipam

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"

	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// SubnetBits is the size of a node's subnet: a /24.
const SubnetBits = 24

// Claim is one node's claim on a subnet.
type Claim struct {
	Node   string
	Subnet string        // CIDR, e.g. "10.22.7.0/24"
	Since  hlc.Timestamp // when the claim was made
	// Settled: the claim stood its settle time and its node runs pods
	// on it.
	Settled bool
}

// Beats reports whether c wins over d for the same subnet: the earlier
// claim, then the lower node name.
func (c Claim) Beats(d Claim) bool {
	if cmp := c.Since.Compare(d.Since); cmp != 0 {
		return cmp < 0
	}
	return c.Node < d.Node
}

// Lost reports whether mine loses its subnet to one of others, and to
// whom: another node's claim of the same subnet, or of one that overlaps
// it (a /28 inside a /24 conflicts with the /24), that Beats it.
func Lost(mine Claim, others []Claim) (string, bool) {
	for _, o := range others {
		if o.Node != mine.Node && overlap(o.Subnet, mine.Subnet) && o.Beats(mine) {
			return o.Node, true
		}
	}
	return "", false
}

// Yields reports whether mine, a claim that has not settled yet, must be
// given up, and to whom: it Lost, or another node holds a settled claim
// that overlaps it. Nodes refuse a new claim on a subnet another node has
// settled, whatever the claims' times (a claim's time is its writer's
// word: a backdated claim must not take a live node's subnet), so a
// claimant that kept an earlier-timed claim against a settled one would
// keep a subnet no peer accepts, and never learn it.
func Yields(mine Claim, others []Claim) (string, bool) {
	if who, lost := Lost(mine, others); lost {
		return who, true
	}
	for _, o := range others {
		if o.Node != mine.Node && o.Settled && overlap(o.Subnet, mine.Subnet) {
			return o.Node, true
		}
	}
	return "", false
}

// Displaced reports whether mine, a claim that has settled (its node runs
// pods on it), must move, and to whom: another node's settled claim
// overlaps it and Beats it. Two claims settle on one subnet only when
// their nodes could not hear each other while they claimed (a partition,
// or nodes forming faster than records spread); once they do, every node
// takes the earlier claim as the holder (Winners), so the later one's
// node has pods no peer routes to, and must claim again. A rival that has
// not settled never displaces a settled claim: it yields itself (Yields).
func Displaced(mine Claim, others []Claim) (string, bool) {
	for _, o := range others {
		if o.Node != mine.Node && o.Settled && overlap(o.Subnet, mine.Subnet) && o.Beats(mine) {
			return o.Node, true
		}
	}
	return "", false
}

// overlap reports whether two subnets share an address (equal strings
// when either does not parse).
func overlap(a, b string) bool {
	pa, errA := netip.ParsePrefix(a)
	pb, errB := netip.ParsePrefix(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return pa.Overlaps(pb)
}

// ErrFull means every /24 of the cluster CIDR is taken.
var ErrFull = errors.New("every /24 of the cluster CIDR is claimed")

// Pick returns a free /24 of cidr for node: the first one not in taken,
// starting from a position derived from the node name (so nodes joining
// at once rarely pick the same one) and wrapping around. The first /24
// (the network's own) is skipped. Errors: ErrFull (wrapped, naming the
// CIDR and what to do), or a cidr that is not an IPv4 range larger than
// a /24.
func Pick(cidr *net.IPNet, node string, taken map[string]bool) (*net.IPNet, error) {
	ones, bits := cidr.Mask.Size()
	if bits != 32 || ones >= SubnetBits {
		return nil, fmt.Errorf("cluster CIDR %s: must be an IPv4 range larger than a /24", cidr)
	}
	count := uint32(1) << (SubnetBits - ones)
	h := fnv.New32a()
	h.Write([]byte(node))
	start := h.Sum32() % count
	base := binary.BigEndian.Uint32(cidr.IP.To4())
	for i := uint32(0); i < count; i++ {
		idx := (start + i) % count
		if idx == 0 {
			continue
		}
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, base+idx<<8)
		sub := &net.IPNet{IP: ip, Mask: net.CIDRMask(SubnetBits, 32)}
		if !taken[sub.String()] {
			return sub, nil
		}
	}
	return nil, fmt.Errorf("%w (%s, %d subnets): widen --cluster-cidr, or free the subnets of dead nodes with 'starling node forget NAME'", ErrFull, cidr, count-1)
}

// Taken returns the subnets of claims, sorted set form, for Pick.
func Taken(claims []Claim) map[string]bool {
	out := map[string]bool{}
	for _, c := range claims {
		out[c.Subnet] = true
	}
	return out
}

// Winners returns the nodes of claims whose claim wins its subnet: no
// other node's overlapping claim Beats it (Lost for each, in one pass).
// A claim whose subnet does not parse never wins. Subnets are parsed
// once and compared only within their /24 (or, for the rare claim wider
// than a /24, with every claim): O(n) for the usual /24 claims, where
// Lost for each would be O(n²) parses.
func Winners(claims []Claim) map[string]bool {
	type parsed struct {
		c Claim
		p netip.Prefix
	}
	buckets := map[netip.Prefix][]parsed{} // by the /24 (or wider) holding the claim
	var wide []parsed
	for _, c := range claims {
		p, err := netip.ParsePrefix(c.Subnet)
		if err != nil || !p.Addr().Is4() {
			continue
		}
		pc := parsed{c, p.Masked()}
		if p.Bits() < SubnetBits {
			wide = append(wide, pc)
			continue
		}
		k := netip.PrefixFrom(p.Addr(), SubnetBits).Masked()
		buckets[k] = append(buckets[k], pc)
	}
	out := map[string]bool{}
	beaten := func(mine parsed, others []parsed) bool {
		for _, o := range others {
			if o.c.Node != mine.c.Node && o.p.Overlaps(mine.p) && o.c.Beats(mine.c) {
				return true
			}
		}
		return false
	}
	for _, b := range buckets {
		for _, mine := range b {
			if !beaten(mine, b) && !beaten(mine, wide) {
				out[mine.c.Node] = true
			}
		}
	}
	for _, mine := range wide {
		lost := beaten(mine, wide)
		for _, b := range buckets {
			if lost {
				break
			}
			lost = beaten(mine, b)
		}
		if !lost {
			out[mine.c.Node] = true
		}
	}
	return out
}
