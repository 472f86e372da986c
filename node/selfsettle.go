package node

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
)

// A node back from down settles itself as its peers settle it.
//
// The rule (issue 39): while a node is unsure whether its peers count it,
// it runs no replica they may have replaced. Its peers replace the
// replicas of a member they hold dead or left at once, and count it for
// placement again only once it has been back for --rejoin-settle (flap
// damping, AliveAfter). A node that joins after a crash or a move to a
// new address asks its peers, before it acts on the cluster's state, how
// long they will go on settling it, and leaves itself out of placement
// for as long: it stops the copies its peers run in its stead and takes
// its replicas back when they count it again, with the rollout's
// handover (maxSurge), so no replica runs twice for longer than that.
// Back before its peers found it dead (they never replaced anything),
// it is counted at once. Its record says until when it leaves itself out
// (view.SettlingOut), so a peer that never held it down leaves it out too.

const (
	// settleQuestion asks a peer how long it will go on settling the
	// asker; the answer is 4 bytes, big-endian, in milliseconds (0: the
	// peer counts the asker for placement now).
	settleQuestion = 0xfc
	// settleAsked is how many peers a joining node asks.
	settleAsked = 3
)

// answerSettle answers a peer's settleQuestion: how long from now this
// node will go on leaving the asker out of placement (Flaps.SettleLeft).
func (m *members) answerSettle(from string, now time.Time) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(m.SettleLeft(from, now)/time.Millisecond))
}

// askSettle asks up to settleAsked alive peers, at once, how long they
// will go on settling this node, and leaves this node out of its own
// placement (AliveAfter) until the longest answer has passed, capped at
// --rejoin-settle (a peer's answer is untrusted). Peers that do not answer
// within introduceAskTimeout (an older version) count as 0.
func (m *members) askSettle(now func() time.Time) {
	var peers []string
	for _, mem := range m.cluster.Members() {
		if mem.Name != m.self && mem.State == gossip.StateAlive && (m.certified == nil || m.certified.certified(mem.Name)) {
			peers = append(peers, mem.Name)
		}
	}
	rand.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	peers = peers[:min(len(peers), settleAsked)]
	var mu sync.Mutex
	var longest time.Duration
	var from string
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _, err := m.cluster.Ask(p, []byte{settleQuestion}, introduceAskTimeout)
			if err != nil || len(b) != 4 {
				return
			}
			d := min(time.Duration(binary.BigEndian.Uint32(b))*time.Millisecond, m.settle)
			mu.Lock()
			if d > longest {
				longest, from = d, p
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	m.SettleSelf(now(), longest, from)
}

// settleRecheck is how often a node back from down asks its peers again,
// for --rejoin-settle after its join, how long they settle it.
const settleRecheck = time.Second

// recheckSettle asks the settleQuestion again every settleRecheck until
// until. A node back at a new address before its peers found it dead
// asked them at its join, when they still held its earlier run up and
// answered 0; a peer whose suspicion of the old address ends in "dead"
// only after that replaces this node's replicas and settles it. Seen in
// CI under load: both ran copies for 11.8 s, until the peer counted this
// node again. Asking on for the length of a settle catches a verdict up
// to --rejoin-settle late.
func (m *members) recheckSettle(ctx context.Context, until time.Time, ask func()) {
	t := time.NewTicker(settleRecheck)
	defer t.Stop()
	for time.Now().Before(until) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			ask()
		}
	}
}
