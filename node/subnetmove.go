package node

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/view"

	"github.com/starling-orchestrator/starling/net/ipam"
)

// A settled claim that is displaced moves.
//
// Two nodes settle one subnet when they could not hear each other while
// they claimed it: the two sides of a partition, a node down longer than
// --subnet-reclaim-after whose subnet a new node took, or, while hundreds
// of nodes form, two claimants whose records had not reached each other
// (at 1,000 simulated nodes, one subnet in most runs). Once they hear each
// other, every node takes the earlier claim as the holder (ipam.Winners):
// it routes the subnet to that node, and the other is not eligible for
// replicas. The later claim's node therefore gives its subnet up, claims
// another the way a new node does, and rebuilds its pods' sandboxes on it
// (reconcile.Container.OutsideSubnet); meanwhile its record says it is not
// ready, so its replicas run elsewhere and no peer routes to it.
//
// It learns of the earlier claim from the records it holds or, when it
// refused that record (checkTakeover refuses a claim that would take a
// settled subnet, this node's own included), from the refusal
// (noteRival). Peers keep refusing the earlier claim while the later one
// still holds the subnet in their view, so traffic keeps one destination
// until the move is published. Only a settled claim of a live member,
// in a record whose time, signature and certificate verified, makes a
// node move. A claim known only from a refusal must also be named as the
// holder by one of the subnet's arbiters other than its claimant
// (arbitersName): after a partition heals, the earlier claimant's side
// holds both claims and names it; a claim backdated by a member to take
// a live node's subnet is refused by every honest node, and none names
// it. (In a cluster of two there is no third node to ask, and the
// earlier claim is taken at its word.) A node displaced again within
// moveBackoffWindow of its last move waits, longer each time, and says
// so: something claims the subnets it moves to.

// keepCheckEvery is how often a settled claim is checked against the
// claims held, besides every view change and every refusal that names a
// rival.
const keepCheckEvery = 5 * time.Second

// A node displaced again within moveBackoffWindow of its last move waits
// moveBackoffMin, doubling to moveBackoffMax, before it moves.
const (
	moveBackoffWindow = 10 * time.Minute
	moveBackoffMin    = 10 * time.Second
	moveBackoffMax    = 5 * time.Minute
)

// maxRivals bounds the rival claims remembered from refused records (the
// names come from peers), and those waiting to be noted (refused).
const maxRivals = 16

// keepClaim watches this node's settled claim for as long as ctx lasts,
// and moves it when an earlier settled claim displaces it.
func (sn *subnets) keepClaim(ctx context.Context, claim ipam.Claim) {
	var lastMove time.Time
	var gap time.Duration
	for {
		regCtx, stop := context.WithCancel(ctx)
		go sn.stayRegistered(regCtx, claim)
		who, ok := sn.awaitDisplaced(ctx, claim)
		stop()
		if !ok {
			return
		}
		if !lastMove.IsZero() && time.Since(lastMove) < moveBackoffWindow {
			gap = min(max(2*gap, moveBackoffMin), moveBackoffMax)
			sn.log.Error("this node's pod subnet was displaced again soon after it moved; waiting before it moves again (does a node claim subnets it does not hold?)",
				"subnet", claim.Subnet, "holder", who, "lastMove", lastMove, "wait", gap)
			select {
			case <-ctx.Done():
				return
			case <-time.After(gap):
			}
		} else {
			gap = 0
		}
		lastMove = time.Now()
		sn.log.Warn("another node settled this node's pod subnet earlier (a partition, or nodes that claimed before they heard each other); moving this node and its pods to another subnet",
			"subnet", claim.Subnet, "holder", who)
		sn.settled.Store(false)
		sn.publish() // not ready: peers stop placing replicas here
		next, ok := sn.settleClaim(ctx, ipam.Claim{}, false, map[string]bool{claim.Subnet: true})
		if !ok {
			return
		}
		for !sn.useClaim(next) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
			}
		}
		sn.mu.Lock()
		sn.rivals = nil
		sn.mu.Unlock()
		sn.publish()
		claim = next
	}
}

// awaitDisplaced waits until claim is displaced (displaced) and returns
// by whom; ok false when ctx ended first.
func (sn *subnets) awaitDisplaced(ctx context.Context, claim ipam.Claim) (string, bool) {
	tick := time.NewTicker(keepCheckEvery)
	defer tick.Stop()
	var asked time.Time // the arbiters were last asked about a rival
	for {
		changed := sn.claims.Changed()
		who, held, moved := sn.displaced(claim)
		if moved && held {
			return who, true
		}
		// A rival known from a refusal: its arbiters are asked at most
		// once every keepCheckEvery, not on every view change.
		if moved && time.Since(asked) >= keepCheckEvery {
			if asked = time.Now(); sn.arbitersName(claim, who) {
				return who, true
			}
		}
		select {
		case <-ctx.Done():
			return "", false
		case <-changed:
		case c := <-sn.refused:
			sn.noteRival(c)
		case <-tick.C:
		}
	}
}

// displaced reports whether mine, this node's settled claim, must move
// (ipam.Displaced), and to whom: against the overlapping claims held of
// nodes whose claims are still reserved (held true), else the rivals
// noted from refused records of members that are up (held false).
func (sn *subnets) displaced(mine ipam.Claim) (who string, held, moved bool) {
	mine.Settled = true
	var others []ipam.Claim
	claims := sn.claims.Load()
	for _, h := range claims.Near(view.NodeStatus{Name: sn.self, PodSubnet: mine.Subnet}) {
		if h.Name != sn.self && claims.Reserved(h.Name, sn.reclaimAfter) {
			others = append(others, ipam.Claim{Node: h.Name, Subnet: h.PodSubnet, Since: h.SubnetSince, Settled: h.SubnetReady})
		}
	}
	if who, moved := ipam.Displaced(mine, others); moved {
		return who, true, true
	}
	others = others[:0]
	sn.mu.Lock()
	rivals := make([]ipam.Claim, 0, len(sn.rivals))
	for _, c := range sn.rivals {
		rivals = append(rivals, c)
	}
	sn.mu.Unlock()
	for _, c := range rivals {
		if m, ok := sn.gossip.Member(c.Node); ok && m.State.Up() {
			others = append(others, c)
		}
	}
	who, moved = ipam.Displaced(mine, others)
	return who, false, moved
}

// arbitersName reports whether one of the arbiters of claim's subnet
// other than who names who as its holder (claimQuestion), or whether no
// node but who and this one is up to ask.
func (sn *subnets) arbitersName(claim ipam.Claim, who string) bool {
	p, err := netip.ParsePrefix(claim.Subnet)
	if err != nil {
		return false
	}
	p = p.Masked()
	q := append([]byte{claimQuestion}, p.String()...)
	asked := 0
	for _, a := range arbiters(p.String(), sn.self, sn.gossip.Members()) {
		if a == who {
			continue
		}
		asked++
		if b, _, err := sn.gossip.Ask(a, q, claimAskTimeout); err == nil && string(b) == who {
			return true
		}
	}
	if asked == 0 {
		for _, m := range sn.gossip.Members() {
			if m.State.Up() && m.Name != sn.self && m.Name != who {
				return false // up, but not among the arbiters: ask again later
			}
		}
		return true
	}
	sn.lastCheck.Store(fmt.Sprintf("a refused claim of %s on this node's subnet %s: no arbiter named it", api.OneLine(who), p))
	return false
}

// noteRival is told of each status record this node refused as a
// takeover of a settled subnet, once its signature and certificate
// verified: c is the refused record's claim (from refused, by the check
// of this node's settled claim). A settled claim that displaces this
// node's settled one is remembered.
func (sn *subnets) noteRival(c ipam.Claim) {
	mine := sn.current()
	if !c.Settled || c.Node == sn.self || mine.Subnet == "" || !sn.settled.Load() {
		return
	}
	mine.Settled = true
	if _, moved := ipam.Displaced(mine, []ipam.Claim{c}); !moved {
		return
	}
	sn.mu.Lock()
	if _, ok := sn.rivals[c.Node]; ok || len(sn.rivals) < maxRivals {
		if sn.rivals == nil {
			sn.rivals = map[string]ipam.Claim{}
		}
		sn.rivals[c.Node] = c
	}
	sn.mu.Unlock()
}

// localSubnet is this node's settled pod subnet for
// reconcile.Local.Subnet: invalid while none is settled, or when the
// claim does not parse.
func localSubnet(claim ipam.Claim, settled bool) netip.Prefix {
	p, err := netip.ParsePrefix(claim.Subnet)
	if !settled || err != nil {
		return netip.Prefix{}
	}
	return p
}
