package node

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/net/ipam"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/member"
	"github.com/starling-orchestrator/starling/placement"
)

// Claim checks: before a new subnet claim settles, its node asks the
// claim's arbiters which node holds the subnet.
//
// Gossip alone cannot keep two nodes off one subnet: nodes that join at
// once pick before they hear each other's claims, and while a thousand
// nodes form, a record takes longer to reach everyone than --subnet-settle.
// Peers asked at random answered from the claims gossip had brought them,
// and often knew only one of two rival claims: at 1,000 simulated nodes,
// dozens of subnets settled twice. Each side's peers then refused the
// other's record as a takeover of a settled subnet, so the cluster split
// for good on who held it, and the records of both spread no further.
//
// So the arbiters of a subnet are fixed: the claimCheckPeers live members
// with the highest rendezvous score for it (Thaler & Ravishankar 1998),
// the same for every claimant that sees the same members. An arbiter
// remembers the first node that asked it about the subnet and names it to
// every later asker until the check is over (askers.keep), unless a settled
// claim holds the subnet. Two claimants of one subnet ask the same
// arbiters, each of which names one of them, so at most one is named by
// all of its arbiters and settles; the other picks another subnet.

// claimQuestion starts a claim check: the rest of the question is a
// subnet; the answer is the node the asked peer takes as its holder ("" for
// none).
const claimQuestion = 0xfe

// claimCheckPeers is how many arbiters a new claim is checked with a
// round, claimCheckRounds how many rounds at most, claimAskTimeout how
// long an arbiter's answer is waited for.
const (
	claimCheckPeers  = 5
	claimCheckRounds = 10
	claimAskTimeout  = time.Second
)

// stillClaims reports whether a, the first asker about subnet p, may still
// hold or be checking its claim: its record, if this node holds it, claims
// p (or nothing yet), and it asked within askers.keep or is up.
func (sn *subnets) stillClaims(p netip.Prefix, a askedClaim, now time.Time) bool {
	// A record written before the question may show the subnet the
	// asker claimed before this one (it lost it and picked again).
	if s, ok := sn.claims.Load().Held(a.node); ok && s.PodSubnet != "" && time.Unix(0, s.Version.Wall).After(a.at) {
		if q, err := netip.ParsePrefix(s.PodSubnet); err != nil || q.Masked() != p {
			return false
		}
	}
	if now.Sub(a.at) < sn.askers.keep {
		return true
	}
	m, ok := sn.gossip.Member(a.node)
	return ok && m.State.Up()
}

// holder is the node whose claim on subnet p (or one overlapping it) this
// node takes as the holder, for asker: a settled claim it holds (its own
// included) before any other, since peers refuse any new claim on a
// settled subnet; else the first asker (see above); "" for none.
func (sn *subnets) holder(p netip.Prefix, asker string, now time.Time) string {
	claims := sn.others()
	if mine := sn.current(); mine.Subnet != "" {
		mine.Settled = sn.settled.Load()
		claims = append(claims, mine)
	}
	var best *ipam.Claim
	for i := range claims {
		c := &claims[i]
		if !c.Settled || !overlaps(c.Subnet, p.String()) {
			continue
		}
		if best == nil || c.Beats(*best) {
			best = c
		}
	}
	if best != nil {
		return best.Node
	}
	return sn.askers.first(p, asker, now, func(a askedClaim) bool { return sn.stillClaims(p, a, now) })
}

// answerClaim answers a claim check from node from: the holder of the
// subnet asked.
func (sn *subnets) answerClaim(from string, q []byte) []byte {
	p, err := netip.ParsePrefix(string(q))
	if err != nil || from == "" || len(from) > 253 || !sn.clusterCIDR.Contains(p.Addr()) {
		return nil
	}
	return []byte(sn.holder(p.Masked(), from, time.Now()))
}

// arbiterPool is how many of the oldest live members (by the time they
// first started with their data, in their gossip metadata) arbiters are
// chosen from.
const arbiterPool = 16

// arbiters returns the claimCheckPeers members that are up (alive or
// suspect) other than this node first in rendezvous order for subnet
// (placement.Rank), among the arbiterPool oldest: a cluster that grows keeps its old members, so claimants that
// joined minutes apart still ask the same arbiters. (Chosen among all
// members, the arbiters of a node that claimed when the cluster had 150
// members and of one that claimed at 800 were disjoint, and both settled
// one subnet: 14 times at N=1000.)
func arbiters(subnet, self string, members []gossip.Member) []string {
	type aged struct {
		name  string
		since int64
	}
	var pool []aged
	for _, m := range members {
		// Suspects too: under load the oldest members, which answer
		// most questions, are suspected now and then, and dropping them
		// moved the arbiters (at N=1000 a claimant asked n0034..n0095).
		if m.Name == self || !m.State.Up() {
			continue
		}
		since := int64(math.MaxInt64) // an agent without the metadata: youngest
		if meta, ok := member.DecodeMeta(m.Meta); ok {
			since = meta.Since
		}
		pool = append(pool, aged{m.Name, since})
	}
	slices.SortFunc(pool, func(a, b aged) int {
		if a.since != b.since {
			return cmp.Compare(a.since, b.since)
		}
		return strings.Compare(a.name, b.name)
	})
	var nodes []placement.Node
	for _, m := range pool[:min(arbiterPool, len(pool))] {
		nodes = append(nodes, placement.Node{Name: m.name})
	}
	ranked := placement.Rank(nodes, "subnet/"+subnet, 0)
	return ranked[:min(claimCheckPeers, len(ranked))]
}

// confirm checks a claim with its arbiters before it settles. It reports
// ok once every arbiter asked in a round names this node; who is the first other node named (this
// node's own memory of askers counts as an arbiter's: a rival that asked
// it first wins). When too few have answered, another round follows
// --subnet-settle later, up to claimCheckRounds, with the arbiters of the
// membership then. A node without live peers, or whose arbiters never
// answer, is alone and confirms; one whose arbiters answered too rarely
// reports neither ok nor a rival, and checks again. (Before, a claim that
// no peer objected to in ten rounds stood: under load, lost questions let
// rivals settle one subnet twice.)
func (sn *subnets) confirm(ctx context.Context, claim ipam.Claim) (who string, ok bool) {
	p, err := netip.ParsePrefix(claim.Subnet)
	if err != nil {
		return "", false
	}
	q := append([]byte{claimQuestion}, p.Masked().String()...)
	answered := false
	for round := 0; round < claimCheckRounds; round++ {
		now := time.Now()
		if first := sn.askers.first(p.Masked(), sn.self, now, func(a askedClaim) bool { return sn.stillClaims(p.Masked(), a, now) }); first != sn.self {
			return first, false
		}
		asked := arbiters(p.Masked().String(), sn.self, sn.gossip.Members())
		if len(asked) == 0 {
			return "", true
		}
		named := 0
		for _, a := range asked {
			b, _, err := sn.gossip.Ask(a, q, claimAskTimeout)
			switch {
			case err != nil || len(b) == 0 || len(b) > 255:
			case string(b) == sn.self:
				named++
				answered = true
			default:
				return api.OneLine(string(b)), false
			}
		}
		sn.lastCheck.Store(fmt.Sprintf("round %d: %d of arbiters %v named it", round+1, named, asked))
		if named == len(asked) {
			return "", true
		}
		select {
		case <-ctx.Done():
			return "", false
		case <-time.After(sn.settle):
		}
	}
	if !answered {
		sn.lastCheck.Store("no arbiter answered in any round: alone, the claim stands")
		return "", true
	}
	return "", false // answers, but never enough: the claimant checks again
}

// metaSince holds, in the store's meta, when this node first started with
// its data (Unix nanoseconds): its age as a member, gossiped in its
// metadata (arbiters).
const metaSince = "member-since"

// memberSince returns when this node first started with its data,
// recording now on the first start.
func memberSince(st Store, log *slog.Logger) int64 {
	if b, ok, err := st.GetMeta(metaSince); err == nil && ok && len(b) == 8 {
		return int64(binary.BigEndian.Uint64(b))
	}
	now := time.Now().UnixNano()
	if err := st.PutMeta(metaSince, binary.BigEndian.AppendUint64(nil, uint64(now))); err != nil {
		log.Warn("record when this node first started", "err", err)
	}
	return now
}

// registerEvery is how often a node with a settled claim checks whether
// its subnet's arbiters changed (registerFor after settling at most).
const (
	registerEvery = 10 * time.Second
	registerFor   = 10 * time.Minute
)

// stayRegistered keeps this node the first asker of its settled claim's
// arbiters while the cluster forms: when the arbiters change (the oldest
// members were fewer than arbiterPool when it claimed, or one of them
// died), it asks the new ones, which then name it to any later claimant
// that has not heard of its claim yet. An arbiter that names another node
// is logged: two nodes hold the subnet.
func (sn *subnets) stayRegistered(ctx context.Context, claim ipam.Claim) {
	p, err := netip.ParsePrefix(claim.Subnet)
	if err != nil {
		return
	}
	p = p.Masked()
	q := append([]byte{claimQuestion}, p.String()...)
	asked := map[string]bool{}
	for _, a := range arbiters(p.String(), sn.self, sn.gossip.Members()) {
		asked[a] = true // asked when the claim settled
	}
	end := time.Now().Add(registerFor)
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(registerEvery):
		}
		for _, a := range arbiters(p.String(), sn.self, sn.gossip.Members()) {
			if asked[a] {
				continue
			}
			b, _, err := sn.gossip.Ask(a, q, claimAskTimeout)
			if err != nil || len(b) == 0 || len(b) > 255 {
				continue
			}
			asked[a] = true
			if who := string(b); who != sn.self {
				sn.log.Error("an arbiter of this node's settled subnet names another node: two nodes hold it", "subnet", p, "arbiter", a, "holder", api.OneLine(who))
			}
		}
	}
}
