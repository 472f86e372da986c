package node

import (
	"context"
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
	// member's join, and its return after a leave, with its alive
	// message, which a node can miss (every retransmission of it lost).
	// A member that started long ago and is still unknown is gone (its
	// record stays until someone removes it), not missed.
	introduceWindow = 10 * time.Minute
	// introduceSkew is how far ahead of this node's clock a record's
	// start may be and still count (capTimes lets a writer date it up to
	// hlc.MaxOffset ahead, which would keep it recent for 70 minutes).
	introduceSkew = time.Minute
)

// missedMembers returns, sorted, the names of the nodes whose verified
// statuses say they started within introduceWindow before now (and no
// more than introduceSkew after it) while membership (members, sorted
// by name) has never listed them, or holds them dead or left since
// before that start (a restart after a leave whose alive message this
// node missed); this node (self) aside.
func missedMembers(members []gossip.Member, statuses map[string]NodeStatus, self string, now time.Time) []string {
	var out []string
	for name, s := range statuses {
		if name == self || s.Started.IsZero() || now.Sub(s.Started) > introduceWindow || s.Started.Sub(now) > introduceSkew {
			continue
		}
		i, listed := slices.BinarySearchFunc(members, name, func(m gossip.Member, n string) int { return strings.Compare(m.Name, n) })
		if listed && (members[i].State.Up() || !members[i].Since.Before(s.Started)) {
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// introduceLoop asks gossip to learn of the members that the latest
// view holds a recent record of but membership does not hold up, at two
// looks in a row (introduceEvery apart): a member's record and its
// alive message travel separately, and the record may come first.
// gossip.Cluster.Introduce runs a push/pull with a random live member
// (at most one every gossip.IntroduceGap): a node that missed a join
// learns of it in seconds rather than at its next periodic push/pull
// (up to 180 s at 1,000 nodes), until which it places replicas as if
// the member did not run.
func (m *members) introduceLoop(ctx context.Context, view func() *view) {
	tick := time.NewTicker(introduceEvery)
	defer tick.Stop()
	var before []string
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
		missed := missedMembers(v.members, v.statuses, m.self, time.Now())
		for _, name := range missed {
			if _, again := slices.BinarySearch(before, name); again && m.cluster.Introduce(name) {
				m.log.Info("a member is known from its record but not up in gossip; exchanging state with a live member", "member", name)
				break // one push/pull brings them all
			}
		}
		before = missed
	}
}
