package node

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
)

const (
	// introduceEvery is how often a node looks for members it knows only
	// from their records (introduceLoop).
	introduceEvery = 5 * time.Second
	// introduceWindow is how recently a member must have started for its
	// record alone to make this node look for it: memberlist spreads a
	// member's join with its alive message, which a node can miss (every
	// retransmission of it lost), and a restart makes a new one. A
	// member that started long ago and is still unknown is gone (its
	// record stays until someone removes it), not missed.
	introduceWindow = 10 * time.Minute
)

// unheardOf returns, by name, the gossip addresses of the nodes whose
// verified statuses say they started within introduceWindow before now
// but which membership (members, sorted by name) has never listed, this
// node (self) aside. A status that gives no "ip:port" (written by an
// agent that published only the IP) names no address and is left out.
func unheardOf(members []gossip.Member, statuses map[string]NodeStatus, self string, now time.Time) map[string]netip.AddrPort {
	var out map[string]netip.AddrPort
	for name, s := range statuses {
		if name == self || s.Started.IsZero() || now.Sub(s.Started) > introduceWindow {
			continue
		}
		if _, known := slices.BinarySearchFunc(members, name, func(m gossip.Member, n string) int { return strings.Compare(m.Name, n) }); known {
			continue
		}
		addr, err := netip.ParseAddrPort(s.Advertise)
		if err != nil {
			continue
		}
		if out == nil {
			out = map[string]netip.AddrPort{}
		}
		out[name] = addr
	}
	return out
}

// introduceLoop asks gossip to push/pull with each member that the
// latest view holds a recent record of but membership has never listed,
// at two looks in a row (introduceEvery apart): a member's record and
// its alive message travel separately, and the record may come first.
// It is how a node that missed a member's join learns of it in seconds
// rather than at its next periodic push/pull (up to 180 s at 1,000
// nodes); until then it places replicas as if the member did not exist.
func (m *members) introduceLoop(ctx context.Context, view func() *view) {
	tick := time.NewTicker(introduceEvery)
	defer tick.Stop()
	var before map[string]netip.AddrPort
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		v := view()
		if v == nil {
			continue
		}
		now := unheardOf(v.members, v.statuses, m.self, time.Now())
		for name, addr := range now {
			if _, again := before[name]; again && m.cluster.Introduce(name, addr) {
				m.log.Info("a member is known from its record but not from gossip; exchanging state with it", "member", name, "addr", addr)
			}
		}
		before = now
	}
}
