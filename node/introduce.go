package node

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/member"
	"github.com/starling-orchestrator/starling/node/view"
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
	// start may be and still count (view.CapTimes lets a writer date it up to
	// hlc.MaxOffset ahead, which would keep it recent for 70 minutes).
	introduceSkew = time.Minute
	// upQuestion asks a peer which of some members it holds up (alive
	// or suspect): the rest of the question is their names, each one
	// length byte and the name, at most upQuestionLen bytes in all; the
	// answer is a bitmap, bit i (of byte i/8, least significant first)
	// set when the i-th name is up.
	upQuestion    = 0xfd
	upQuestionLen = 1000
	// introduceAskTimeout is how long a peer's answer to an upQuestion
	// is waited for (the next look asks another).
	introduceAskTimeout = time.Second
)

// missedMembers returns, sorted, the names of the nodes whose verified
// statuses say they started within introduceWindow before now (and no
// more than introduceSkew after it) while membership (members, sorted
// by name) has never listed them, or holds them dead or left from an
// earlier run (laterRun: a restart whose alive message this node
// missed); this node (self) aside.
func missedMembers(members []gossip.Member, statuses map[string]view.NodeStatus, self string, now time.Time) []string {
	var out []string
	for name, s := range statuses {
		if name == self || s.Started.IsZero() || now.Sub(s.Started) > introduceWindow || s.Started.Sub(now) > introduceSkew {
			continue
		}
		i, listed := slices.BinarySearchFunc(members, name, func(m gossip.Member, n string) int { return strings.Compare(m.Name, n) })
		if listed && (members[i].State.Up() || !laterRun(members[i], s)) {
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// laterRun reports whether status s is of a later run of the node's
// agent than the one membership last heard of (m, held down): its start
// is after the run start m's metadata gives, both by the node's own
// clock (as view.StaleRecords compares them), or, for metadata that gives
// none, after m went down by this node's clock.
func laterRun(m gossip.Member, s view.NodeStatus) bool {
	if meta, ok := member.DecodeMeta(m.Meta); ok && meta.Started != 0 {
		return s.Started.Unix() > meta.Started/int64(time.Second)
	}
	return m.Since.Before(s.Started)
}

// introduceLoop learns of the members that the latest view holds a
// recent record of but membership does not hold up, at two looks in a
// row (introduceEvery apart: a member's record and its alive message
// travel separately, and the record may come first). Each look it asks
// one random live peer which of them it holds up (upQuestion, as many as
// fit, in random order) and, if it holds one up, has gossip push/pull
// with it (gossip.Cluster.Introduce: at most one every
// gossip.IntroduceGap). A node that missed a join learns of it in
// seconds rather than at its next periodic push/pull (up to 180 s at
// 1,000 nodes), until which it places replicas as if the member did not
// run. Names a join token's holder mints (records of nodes that never
// join) cost one question a look while an introduction could run, not
// a push/pull (a peer that answers yes gets one push/pull with itself
// per gossip.IntroduceGap); past the question's size they can delay an
// introduction. Peers of an older version answer no such question:
// while few are upgraded, introductions rarely run.
func (m *members) introduceLoop(ctx context.Context, view func() *view.View) {
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
		missed := missedMembers(v.Members, v.Statuses, m.self, time.Now())
		var again []string
		for _, name := range missed {
			if _, ok := slices.BinarySearch(before, name); ok {
				again = append(again, name)
			}
		}
		before = missed
		if len(again) > 0 {
			rand.Shuffle(len(again), func(i, j int) { again[i], again[j] = again[j], again[i] })
			m.introduce(again, v.Members)
		}
	}
}

// introduce asks one random alive member which of names it holds up
// and, if it holds one up, has gossip push/pull with it.
func (m *members) introduce(names []string, members []gossip.Member) {
	var peers []string
	for _, mem := range members {
		if mem.Name != m.self && mem.State == gossip.StateAlive {
			peers = append(peers, mem.Name)
		}
	}
	q, asked := encodeUpQuestion(names)
	if len(peers) == 0 || len(asked) == 0 || m.cluster.IntroduceWait() > 0 {
		return // no one to ask, nothing to ask, or no push/pull would run
	}
	via := peers[rand.IntN(len(peers))]
	b, _, err := m.cluster.Ask(via, q, introduceAskTimeout)
	if err != nil || len(b) != (len(asked)+7)/8 {
		return
	}
	for i, name := range asked {
		if b[i/8]&(1<<(i%8)) != 0 {
			if m.cluster.Introduce(name, via) {
				m.log.Info("a member is known from its record but not up in gossip; exchanging state with a peer that holds it up", "member", name, "via", via)
			}
			return // one push/pull brings them all
		}
	}
}

// answerUp answers a peer's upQuestion (q, after its type byte): nil
// when it does not parse.
func (m *members) answerUp(q []byte) []byte {
	names, ok := decodeUpQuestion(q)
	if !ok {
		return nil
	}
	out := make([]byte, (len(names)+7)/8)
	for i, name := range names {
		if st, known := m.cluster.State(name); known && st.Up() {
			out[i/8] |= 1 << (i % 8)
		}
	}
	return out
}

// encodeUpQuestion returns the upQuestion about names, in their order,
// as many as fit upQuestionLen (a name longer than 255 bytes is left
// out), and the names it holds.
func encodeUpQuestion(names []string) (q []byte, asked []string) {
	q = []byte{upQuestion}
	for _, name := range names {
		if name == "" || len(name) > 255 || len(q)+1+len(name) > upQuestionLen {
			continue
		}
		q = append(append(q, byte(len(name))), name...)
		asked = append(asked, name)
	}
	return q, asked
}

// decodeUpQuestion parses an upQuestion's names (q, after its type
// byte), a peer's untrusted bytes: ok is false when a length runs past
// the end, a name is empty, or there is none, or the whole question is
// over upQuestionLen bytes (q of upQuestionLen bytes or more).
func decodeUpQuestion(q []byte) (names []string, ok bool) {
	if len(q) == 0 || len(q) >= upQuestionLen {
		return nil, false
	}
	for len(q) > 0 {
		n := int(q[0])
		if n == 0 || len(q) < 1+n {
			return nil, false
		}
		names = append(names, string(q[1:1+n]))
		q = q[1+n:]
	}
	return names, true
}
