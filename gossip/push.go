package gossip

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// A writer's direct sends. Announcements and deltas travel on UDP gossip,
// a few transmissions each, and memberlist fills each gossip packet with
// its own messages first: a write must not depend on gossip alone to
// leave its writer. An e2e test found a node status stuck at an old
// version on both peers, every announcement of the last versions lost;
// and a node that has just joined re-gossips the alive message of every
// member it learned of (memberlist's aliveNode), each mult*log(N) times,
// ahead of its own deltas: at 300 nodes its first record, a delta of 260
// bytes, reached its peers 15 s after it was written, at 1,000 nodes
// about a minute.
//
// So every write also goes over TCP to directPeers live members picked
// at random, which gossip it on (a delta) or announce it (a record too
// large for one). Writes are coalesced: one flush at a time sends what
// was written since the last one began, the last version of each key, in
// push messages of about maxBatchLen bytes, to directPeers members at
// once. A lone write leaves at once; a burst (a manifest of 50 objects,
// the revisions a Deployment's deletion tombstones) costs a few
// connections, not directPeers per write: 200 writes in a burst, 3 to 18
// messages (TestBurstOfWritesCostsAFewDirectSends).
//
//	push  11, a records message (type 2, or 10 compressed)   direct (TCP): receivers gossip on its deltas

// protoPush is the delegate protocol version that reads msgPush. A member
// of an earlier version is sent each write as before: a delta, or a
// records message.
const protoPush = 2

// directQueue holds the writes waiting for this node's next flush.
type directQueue struct {
	mu      sync.Mutex
	pending []directWrite  // in write order, one per key
	at      map[string]int // key -> index in pending
	busy    bool           // a flush runs
}

type directWrite struct {
	e   entry
	enc []byte
}

// pushToFew queues r (encoded as enc), just written here, for the direct
// sends, and starts a flush unless one runs.
func (c *Cluster) pushToFew(r crdt.Record, enc []byte) {
	q := &c.direct
	w := directWrite{entryOf(r, enc), enc}
	q.mu.Lock()
	if i, ok := q.at[r.Key]; ok {
		if compareEntries(w.e, q.pending[i].e) > 0 {
			q.pending[i] = w
		}
	} else {
		if q.at == nil {
			q.at = map[string]int{}
		}
		q.at[r.Key] = len(q.pending)
		q.pending = append(q.pending, w)
	}
	start := !q.busy
	q.busy = true
	q.mu.Unlock()
	if start {
		c.spawn(c.flushDirect)
	}
}

// flushDirect sends what is queued until nothing is (or the cluster
// shuts down: what is left is gossiped).
func (c *Cluster) flushDirect() {
	q := &c.direct
	for {
		q.mu.Lock()
		batch := q.pending
		q.pending, q.at = nil, nil
		if len(batch) == 0 || c.ctx.Err() != nil {
			q.busy = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		c.sendDirect(batch)
	}
}

// sendDirect sends batch to directPeers live members at once and waits
// for the sends, at most TCPTimeout: memberlist bounds the dial of a
// reliable send but not its write, and a member that accepts and stops
// reading (frozen, or its host gone mid-write) must not hold this node's
// direct sends (a send that outlives the wait ends on its own; writes
// meanwhile join the next flush).
func (c *Cluster) sendDirect(batch []directWrite) {
	peers := c.livePeers()
	rand.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	peers = peers[:min(directPeers, len(peers))]
	var push [][]byte
	if slices.ContainsFunc(peers, func(p *memberlist.Node) bool { return p.DMax >= protoPush }) {
		encs := make([][]byte, len(batch))
		for i, w := range batch {
			encs[i] = w.enc
		}
		for _, m := range encodeRecords(encs) { // compressed where that is smaller
			push = append(push, encodePush(forPeer(&memberlist.Node{DMax: protoPush}, m)))
		}
	}
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Add(1)
		go func() { // not spawn: Shutdown must not wait for a stuck write
			defer wg.Done()
			msgs := push
			if p.DMax < protoPush {
				msgs = legacyDirect(p, batch, c.maxDelta)
			}
			for _, m := range msgs {
				if c.ctx.Err() != nil {
					return
				}
				c.directSends.Add(1)
				if err := c.ml.SendReliable(p, m); err != nil {
					c.log.Debug("direct send failed; gossip and anti-entropy will repair", "to", p.Name, "records", len(batch), "err", err)
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(c.cfg.TCPTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-c.ctx.Done():
	case <-t.C:
		c.log.Debug("direct sends still running after the TCP timeout; the next flush does not wait for them", "records", len(batch))
	}
}

// maxLegacyDeltas bounds the deltas a member that does not read push
// messages is sent per flush, one connection each, in turn (during an
// upgrade): the others reach it by gossip and anti-entropy.
const maxLegacyDeltas = 32

// legacyDirect is what a member that does not read push messages is sent
// for batch: each write that fits a delta as a delta (it gossips it on),
// up to maxLegacyDeltas, the others in records messages (it announces
// them).
func legacyDirect(p *memberlist.Node, batch []directWrite, maxDelta int) [][]byte {
	var out, large [][]byte
	for _, w := range batch {
		switch {
		case 1+len(w.enc) > maxDelta:
			large = append(large, w.enc)
		case len(out) < maxLegacyDeltas:
			out = append(out, encodeDelta(w.enc))
		}
	}
	if len(large) > 0 {
		for _, m := range encodeRecords(large) {
			out = append(out, forPeer(p, m))
		}
	}
	return out
}

// encodePush wraps a records message, plain or compressed.
func encodePush(records []byte) []byte {
	return append([]byte{byte(msgPush)}, records...)
}

// decodePush returns the records message a push message holds,
// decompressed. It refuses anything but one records message (type 2 or
// 10) after the type byte.
func decodePush(b []byte) ([]byte, error) {
	if err := checkType(b, msgPush); err != nil {
		return nil, err
	}
	switch inner := b[1:]; {
	case len(inner) == 0:
		return nil, fmt.Errorf("%w: push: empty", errMalformed)
	case msgType(inner[0]) == msgRecords:
		return inner, nil
	case msgType(inner[0]) == msgRecordsZ:
		return decodeRecordsZ(inner)
	default:
		return nil, fmt.Errorf("%w: push: holds a %v message, want records", errMalformed, msgType(inner[0]))
	}
}
