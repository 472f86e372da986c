package view

import (
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/starling-orchestrator/starling/net/ipam"
)

// claimIndex holds the subnet claims of the held node statuses by the /24
// that holds each (claims wider than a /24 apart), and the nodes whose
// claim wins (ipam.Winners), kept up to date one claim at a time: a claim
// competes only with the claims of its /24 and the wide ones, so a
// changed claim re-resolves its /24s alone. Resolving every claim on
// each change, and comparing a new claim with every node's, cost O(N) per
// claim at each node: O(N^3) across a forming cluster (a fifth of the CPU
// of 1,000 simulated nodes). Not safe for concurrent use (Builder.build).
type claimIndex struct {
	// by holds the narrow claims by /24, usually one each: a slice, as
	// a map of one entry cost about 700 bytes (a third of a simulated
	// agent's claim index at 1,000 nodes).
	by      map[netip.Prefix][]ipam.Claim
	wide    map[string]ipam.Claim
	prefix  map[string]netip.Prefix // each indexed node's claim, parsed
	winners map[string]bool
}

func newClaimIndex() *claimIndex {
	return &claimIndex{by: map[netip.Prefix][]ipam.Claim{}, wide: map[string]ipam.Claim{},
		prefix: map[string]netip.Prefix{}, winners: map[string]bool{}}
}

// bucketOf is the /24 holding p; ok false for a prefix wider than a /24.
func bucketOf(p netip.Prefix) (netip.Prefix, bool) {
	if p.Bits() < ipam.SubnetBits {
		return p, false
	}
	return netip.PrefixFrom(p.Addr(), ipam.SubnetBits).Masked(), true
}

// set makes s (ok false: none) node name's claim and re-resolves the
// /24s it left and entered (every claim while any claim is wide).
func (ix *claimIndex) set(name string, s NodeStatus, ok bool) {
	var touched []netip.Prefix
	wide := false // a wide claim left or came: every claim may change
	if p, had := ix.prefix[name]; had {
		if b, narrow := bucketOf(p); narrow {
			ix.by[b] = slices.DeleteFunc(ix.by[b], func(c ipam.Claim) bool { return c.Node == name })
			if len(ix.by[b]) == 0 {
				delete(ix.by, b)
			}
			touched = append(touched, b)
		} else {
			delete(ix.wide, name)
			wide = true
		}
		delete(ix.prefix, name)
	}
	delete(ix.winners, name)
	if p, parsed := s.Prefix(); ok && s.PodSubnet != "" && parsed && p.Addr().Is4() {
		c := ipam.Claim{Node: name, Subnet: s.PodSubnet, Since: s.SubnetSince}
		ix.prefix[name] = p
		if b, narrow := bucketOf(p); narrow {
			ix.by[b] = append(ix.by[b], c)
			touched = append(touched, b)
		} else {
			ix.wide[name] = c
			wide = true
		}
	}
	if wide || len(ix.wide) > 0 {
		ix.resolveAll()
		return
	}
	for _, b := range touched {
		for _, c := range ix.by[b] {
			delete(ix.winners, c.Node)
		}
		for n := range ipam.Winners(ix.by[b]) {
			ix.winners[n] = true
		}
	}
}

// resolveAll computes the winners of every claim.
func (ix *claimIndex) resolveAll() {
	var claims []ipam.Claim
	for _, b := range ix.by {
		claims = append(claims, b...)
	}
	for _, c := range ix.wide {
		claims = append(claims, c)
	}
	ix.winners = ipam.Winners(claims)
}

// near calls f with every indexed node whose claim may overlap p: those
// of p's /24 and the wide ones (every node, for a p wider than a /24).
func (ix *claimIndex) near(p netip.Prefix, f func(name string)) {
	b, narrow := bucketOf(p.Masked())
	if !narrow {
		for name := range ix.prefix {
			f(name)
		}
		return
	}
	for _, c := range ix.by[b] {
		f(c.Node)
	}
	for name := range ix.wide {
		f(name)
	}
}

// reclaimedWinners returns v.claimWinners with the nodes added whose claim
// loses only to claims that no longer hold (reserved: their node is down
// and its record older than --subnet-reclaim-after). Such a subnet is
// free: the claim of a new node on it was let settle (subnets.others
// leaves those claims out), so it must also be routed and placed on.
// Left out, the new holder of a dead node's subnet was never eligible
// while the dead node's record stayed. v.claimWinners itself is returned
// when nothing is added (and is never written). It sets v.reclaimAt to
// when the first reservation that beat a claim expires: a rebuild from
// then on must derive again even if no record changed. Called with build
// held.
func (vs *Builder) reclaimedWinners(v *View) map[string]bool {
	v.reclaimAt = time.Time{}
	out, cloned := v.claimWinners, false
	for name, s := range v.Statuses {
		p, ok := s.Prefix()
		if out[name] || s.PodSubnet == "" || !ok {
			continue
		}
		mine := ipam.Claim{Node: name, Subnet: s.PodSubnet, Since: s.SubnetSince}
		beaten := false
		check := func(other string) {
			o, held := v.Statuses[other]
			op, ok := o.Prefix()
			if beaten || other == name || !held || !ok || !op.Overlaps(p) {
				return
			}
			if (ipam.Claim{Node: other, Subnet: o.PodSubnet, Since: o.SubnetSince}).Beats(mine) && vs.reserved(v, other) {
				beaten = true
				if until, ok := vs.reservedUntil(v, other); ok && (v.reclaimAt.IsZero() || until.Before(v.reclaimAt)) {
					v.reclaimAt = until
				}
			}
		}
		vs.claims.near(p, check)
		check(vs.cfg.Self) // its unpublished claim is not in the index
		if beaten {
			continue
		}
		if !cloned {
			out, cloned = maps.Clone(v.claimWinners), true
		}
		out[name] = true
	}
	return out
}

// reservedUntil is when name's reservation expires by time alone: ok
// false while name is up (or is this node), whose claim holds however
// old its record.
func (vs *Builder) reservedUntil(v *View, name string) (time.Time, bool) {
	if name == vs.cfg.Self {
		return time.Time{}, false
	}
	if state, _ := MemberState(v.Members, name); state.Up() {
		return time.Time{}, false
	}
	return time.Unix(0, vs.statuses[StatusKey(name)].from.version.Wall).Add(vs.cfg.ReclaimAfter), true
}

// reserved is Claims.Reserved for node name as v and the records held
// show it; this node's own claim always holds.
func (vs *Builder) reserved(v *View, name string) bool {
	if name == vs.cfg.Self {
		return true
	}
	state, _ := MemberState(v.Members, name)
	return Reserved(state, vs.statuses[StatusKey(name)].from.version, vs.cfg.ReclaimAfter)
}
