package gossip

import (
	"cmp"
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// delegate is memberlist's view of a Cluster: its Delegate, EventDelegate,
// PingDelegate and ConflictDelegate. It is a separate type so that these
// callbacks do not show in Cluster's API.
type delegate struct{ c *Cluster }

var (
	_ memberlist.Delegate         = (*delegate)(nil)
	_ memberlist.EventDelegate    = (*delegate)(nil)
	_ memberlist.PingDelegate     = (*delegate)(nil)
	_ memberlist.ConflictDelegate = (*delegate)(nil)
)

// NodeMeta returns the local metadata, which New and UpdateMeta keep within
// memberlist.MetaMaxSize (memberlist panics beyond limit).
func (d *delegate) NodeMeta(limit int) []byte {
	d.c.metaMu.Lock()
	defer d.c.metaMu.Unlock()
	if len(d.c.meta) > limit {
		return nil
	}
	return slices.Clone(d.c.meta)
}

// NotifyMsg handles one of our messages, from a gossip packet (memberlist's
// packet handler goroutine) or a reliable stream (one goroutine per
// connection). b is only valid during the call. A message that does not
// decode is logged and dropped.
func (d *delegate) NotifyMsg(b []byte) {
	c := d.c
	if !c.gate.enter() {
		return
	}
	defer c.gate.exit()
	if len(b) == 0 {
		c.dropped("empty message", errMalformed)
		return
	}
	switch t := msgType(b[0]); t {
	case msgDelta:
		r, enc, err := decodeDelta(b)
		if err != nil {
			c.dropped("delta", err)
			return
		}
		c.receive(r, slices.Clone(enc), true)
	case msgRecords, msgRecordsZ:
		if t == msgRecordsZ && c.cfg.wireV0 {
			c.dropped("message", errMalformed, "type", t.String(), "len", len(b))
			return
		}
		if t == msgRecordsZ {
			var err error
			if b, err = decodeRecordsZ(b); err != nil {
				c.dropped("records", err)
				return
			}
		}
		recs, encs, err := decodeRecords(b)
		if err != nil {
			c.dropped("records", err)
			return
		}
		for i, r := range recs {
			c.receive(r, encs[i], false)
		}
	case msgPush:
		// A writer's direct send: gossiped on like a delta.
		if c.cfg.wireV0 || c.cfg.noPush {
			c.dropped("message", errMalformed, "type", t.String(), "len", len(b))
			return
		}
		inner, err := decodePush(b)
		if err != nil {
			c.dropped("push", err)
			return
		}
		recs, encs, err := decodeRecords(inner)
		if err != nil {
			c.dropped("push", err)
			return
		}
		for i, r := range recs {
			c.receive(r, slices.Clone(encs[i]), true)
		}
	case msgRequest:
		req, err := decodeRequest(b)
		if err != nil {
			c.dropped("sync request", err)
			return
		}
		c.answer("sync request", func() { c.answerRequest(req) })
	case msgPull:
		p, err := decodePull(b)
		if err != nil {
			c.dropped("pull", err)
			return
		}
		if !c.answerPullByPacket(p) {
			c.answer("pull", func() { c.answerPull(p) })
		}
	case msgHave:
		h, err := decodeHave(b)
		if err != nil {
			c.dropped("have", err)
			return
		}
		c.onHave(h)
	case msgAsk:
		q, err := decodeQuestion(b, msgAsk)
		if err != nil {
			c.dropped("question", err)
			return
		}
		c.onAsk(q)
	case msgAnswer:
		q, err := decodeQuestion(b, msgAnswer)
		if err != nil {
			c.dropped("answer", err)
			return
		}
		c.onAnswer(q)
	case msgDigest:
		// A digest exchange (digestLoop): the receiver syncs.
		remote, err := decodeDigest(b)
		if err != nil {
			c.dropped("digest", err)
			return
		}
		if _, ok := c.peer(remote.From); !ok {
			if !c.rejoinSender(remote.From) {
				c.dropped("digest from a non-member", errNotMember, "from", remote.From)
			}
			return
		}
		c.syncDigest(remote)
	case msgLeave:
		name, err := decodeLeave(b)
		if err != nil {
			c.dropped("leave", err)
			return
		}
		c.observeLeave(name, b)
	default:
		c.dropped("message", errMalformed, "type", t.String(), "len", len(b))
	}
}

// GetBroadcasts returns queued deltas that fit limit bytes, counting
// overhead per message.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	if d.c.cfg.noGossip {
		return nil
	}
	return d.c.queue.GetBroadcasts(overhead, limit)
}

// LocalState returns the digest sent in a push/pull (join or periodic).
func (d *delegate) LocalState(join bool) []byte {
	return encodeDigest(digest{From: d.c.cfg.Name, Buckets: d.c.idx.sums()})
}

// MergeRemoteState compares the peer's digest with ours and, if buckets
// differ and this node's name sorts first, starts a sync with the peer in the
// background (see digest.go). In a join's push/pull, the node whose name
// sorts last also sends its digest a second later (digestAfterJoin): the
// other's sync request can reach a joiner before the joiner knows its
// seed, and is then dropped (no address to answer), which left the
// joiner without the records the seed held until the next digest
// exchange (make demo: a node missing from a joiner's get nodes for
// over 3 s). One 2 KiB digest a join; a sync follows only if the first
// one was lost.
func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	c := d.c
	if !c.gate.enter() {
		return
	}
	defer c.gate.exit()
	remote, err := decodeDigest(buf)
	if err != nil {
		c.dropped("digest", err)
		return
	}
	if remote.From == c.cfg.Name {
		return
	}
	if c.cfg.Name > remote.From {
		if join && c.pendAfterJoin(remote.From) {
			c.spawn(func() { c.digestAfterJoin(remote.From) })
		}
		return
	}
	c.syncDigest(remote)
}

// maxAfterJoin bounds the digests pending after joins (pendAfterJoin).
const maxAfterJoin = 64

// pendAfterJoin notes a digest pending for name after a join's push/pull
// and reports whether one should be sent: not when one already is, or
// maxAfterJoin are.
func (c *Cluster) pendAfterJoin(name string) bool {
	c.afterJoinMu.Lock()
	defer c.afterJoinMu.Unlock()
	if c.afterJoin[name] || len(c.afterJoin) >= maxAfterJoin {
		return false
	}
	c.afterJoin[name] = true
	return true
}

// digestAfterJoin sends this node's digest to member name a second after
// a join's push/pull with it, if it is still a member: name, whose name
// sorts first, then syncs the buckets that still differ (a digest's
// receiver syncs).
func (c *Cluster) digestAfterJoin(name string) {
	defer func() {
		c.afterJoinMu.Lock()
		delete(c.afterJoin, name)
		c.afterJoinMu.Unlock()
	}()
	select {
	case <-c.ctx.Done():
		return
	case <-time.After(time.Second):
	}
	if p, ok := c.peer(name); ok {
		c.sendDigest(p, "digest after join")
	}
}

// sendDigest sends this node's digest to p (its receiver syncs), logging
// a failure as what at debug.
func (c *Cluster) sendDigest(p *memberlist.Node, what string) {
	if err := c.ml.SendReliable(p, encodeDigest(digest{From: c.cfg.Name, Buckets: c.idx.sums()})); err != nil {
		c.log.Debug(what+" failed", "member", p.Name, "err", err)
	}
}

// syncDigest starts a sync of the buckets where remote, a peer's
// digest, differs from ours, in the background (at most syncSem at once).
func (c *Cluster) syncDigest(remote digest) {
	local := c.idx.sums()
	diff := diffBuckets(&local, &remote.Buckets)
	if len(diff) == 0 {
		return
	}
	select {
	case c.syncSem <- struct{}{}:
	default:
		c.log.Debug("sync skipped: too many in progress", "peer", remote.From)
		return
	}
	c.spawn(func() {
		defer func() { <-c.syncSem }()
		c.requestSync(remote.From, diff)
	})
}

// requestSync sends the peer our entries in the differing buckets, in
// requests of about maxBatchLen bytes.
func (c *Cluster) requestSync(peerName string, buckets []uint8) {
	p, ok := c.peer(peerName)
	if !ok {
		return
	}
	c.log.Debug("sync", "peer", peerName, "buckets", len(buckets))
	for len(buckets) > 0 && c.ctx.Err() == nil {
		// Take whole buckets while the request stays under maxBatchLen
		// (always at least one).
		var req request
		size := 0
		n := 0
		for n < len(buckets) {
			es := c.idx.entries(buckets[n : n+1])
			s := 0
			for _, e := range es {
				s += entryLen(e)
			}
			if n > 0 && size+s > maxBatchLen {
				break
			}
			size += s
			req.Entries = append(req.Entries, es...)
			n++
		}
		req.From = c.cfg.Name
		req.Buckets = buckets[:n]
		slices.SortFunc(req.Entries, func(a, b entry) int { return cmp.Compare(a.Key, b.Key) })
		if err := c.ml.SendReliable(p, encodeRequest(req)); err != nil {
			c.log.Debug("sync request failed", "peer", peerName, "err", err)
			return
		}
		buckets = buckets[n:]
	}
}

// answer runs f, which sends to a peer, in a goroutine of c, if fewer than
// maxConcurrentSyncs answers are in progress; otherwise it drops the message
// (the peer retries at its next push/pull). NotifyMsg may run on memberlist's
// packet handler, which must not wait on TCP sends.
func (c *Cluster) answer(what string, f func()) {
	select {
	case c.answerSem <- struct{}{}:
	default:
		c.dropped(what+": too many in progress", errBusy)
		return
	}
	c.spawn(func() {
		defer func() { <-c.answerSem }()
		f()
	})
}

// answerRequest sends the requester the records it lacks or holds older, and
// a pull for those it holds newer.
func (c *Cluster) answerRequest(req request) {
	p, ok := c.peer(req.From)
	if !ok {
		c.dropped("sync request from a non-member", errNotMember, "from", req.From)
		return
	}
	send, pull := plan(c.idx.entries(req.Buckets), req.Entries)
	c.sendRecords(p, send)
	for _, msg := range splitPull(c.cfg.Name, pull) {
		if err := c.ml.SendReliable(p, msg); err != nil {
			c.log.Debug("sync pull failed", "peer", p.Name, "err", err)
			return
		}
	}
}

// answerPull sends the requested records.
func (c *Cluster) answerPull(p pull) {
	to, ok := c.peer(p.From)
	if !ok {
		c.dropped("pull from a non-member", errNotMember, "from", p.From)
		return
	}
	c.pullsAnswered.Add(1)
	c.sendRecords(to, p.Keys)
}

// packetPullRate bounds the pulls this node answers with a packet, a
// second (with a burst of as many): each is a read and a send on
// memberlist's packet handler, which must keep up with probes. A node
// answers about one pull per record written in the cluster (a 1,000-node
// cluster forming writes about 50 a second); pulls beyond the rate are
// answered over TCP (answerPull: at most maxConcurrentSyncs at once, the
// rest dropped), so a flood of pulls, forged or replayed, costs a
// bounded amount of work.
const packetPullRate = 200

// answerPullByPacket answers pull p with one packet, at once, when it
// asks for one record that fits a packet (a record announced under
// Config.AnnounceAbove: its pull asks for it alone) and the rate allows
// (packetPullRate), and reports whether it did. Other pulls (larger
// records, a sync's keys) are answered over TCP (answerPull), in a
// goroutine of their own. A sync's pull of one key answered by a packet
// that is lost waits for the next digest exchange.
func (c *Cluster) answerPullByPacket(p pull) bool {
	if len(p.Keys) != 1 {
		return false
	}
	to, ok := c.peer(p.From)
	if !ok {
		c.dropped("pull from a non-member", errNotMember, "from", p.From)
		return true
	}
	if c.packetPulls.Tokens() < 1 {
		return false // over the rate: nothing read here
	}
	r, ok, err := c.state.Get(p.Keys[0])
	if err != nil {
		return false // answerPull logs it
	}
	var enc []byte
	if ok {
		enc, err = crdt.EncodeRecord(r)
		if err != nil || 1+binary.MaxVarintLen64+binary.MaxVarintLen64+len(enc) > c.maxDelta {
			return false // too big for a packet: answerPull sends it by stream
		}
	}
	if !c.packetPulls.Allow() {
		return false // another pull took the last token since
	}
	c.pullsAnswered.Add(1)
	if !ok {
		return true // no longer held: answerPull would skip it too
	}
	c.packetAnswers.Add(1)
	for _, msg := range encodeRecords([][]byte{enc}) {
		if err := c.ml.SendBestEffort(to, msg); err != nil {
			c.log.Debug("pull answer failed", "peer", to.Name, "err", err)
		}
	}
	return true
}

// sendRecords reads keys from the State and sends them to the peer in records
// messages of about maxBatchLen bytes. Keys no longer held are skipped.
func (c *Cluster) sendRecords(to *memberlist.Node, keys []string) {
	var encs [][]byte
	size := 0
	flush := func() bool {
		for _, msg := range encodeRecords(encs) {
			if err := c.ml.SendReliable(to, forPeer(to, msg)); err != nil {
				c.log.Debug("sync send failed", "peer", to.Name, "err", err)
				return false
			}
		}
		encs, size = nil, 0
		return true
	}
	for _, k := range keys {
		if c.ctx.Err() != nil {
			return
		}
		r, ok, err := c.state.Get(k)
		if err != nil {
			c.log.Error("sync: read record", "key", k, "err", err)
			continue
		}
		if !ok {
			continue
		}
		enc, err := crdt.EncodeRecord(r)
		if err != nil {
			c.log.Error("sync: stored record does not encode", "key", k, "err", err)
			continue
		}
		// Repair the index if the State changed behind its back.
		if e := entryOf(r, enc); e != c.idxEntry(k) {
			c.idx.put(e)
		}
		encs = append(encs, enc)
		size += len(enc)
		if size >= maxBatchLen && !flush() {
			return
		}
	}
	flush()
}

// NotifyJoin records a member that joined or came back.
//
// A member that comes back from dead or left (a healed partition, a
// restart) missed the deltas sent meanwhile, and so did this node; the
// push/pull that memberlist did when they met may have raced the other
// side's own view of the membership (a sync request from a node it does
// not yet count as a member is dropped). So digest exchanges run with
// it 1 s and 3 s later (resyncWith): both sides have the other's records
// within seconds, not at the next digest exchange or periodic push/pull
// (memberlist scales its interval with the cluster: 30 s up to 32 nodes,
// 90 s at 100, 180 s at 1,000). They are run by resyncPeers members
// only, not by every node that saw it gone: with all N-1, a return cost
// 2(N-1) exchanges landing on one node within 2 s (270 MB at 1,000
// nodes when they were push/pulls; memberlist takes at most 128 at once
// and drops the rest).
func (d *delegate) NotifyJoin(n *memberlist.Node) {
	c := d.c
	c.membersMu.Lock()
	delete(c.leaving, n.Name) // back after leaving
	prev, known := c.members[n.Name]
	back := known && !prev.State.Up()
	var was string
	if known && (prev.Addr != n.Addr.String() || prev.Port != n.Port) {
		was = net.JoinHostPort(prev.Addr, strconv.Itoa(int(prev.Port)))
	}
	var downSince time.Time
	if back {
		downSince = prev.Since // setMemberLocked updates prev in place
	}
	changed := c.setMemberLocked(n, StateAlive)
	var stayed []string
	if back {
		stayed = c.upSinceLocked(downSince)
	}
	c.membersMu.Unlock()
	if changed {
		if was != "" {
			c.log.Info("member returned at a new address", "member", n.Name, "addr", n.Address(), "was", was)
		} else {
			c.log.Info("member alive", "member", n.Name, "addr", n.Address())
		}
		c.notify()
	}
	if back && n.Name != c.cfg.Name && slices.Contains(resyncers(n.Name, stayed, resyncPeers), c.cfg.Name) && c.gate.enter() {
		c.spawn(func() { c.resyncWith(n.Name) })
		c.gate.exit()
	}
}

// resyncPeers is how many members run the resyncs with a member that
// came back, chosen among those this node saw up all the time it was
// gone (after a partition heals, the members of the returning node's own
// side come back with it and saw nothing to resync). Three keep the
// exchange when one of them is slow or down too.
const resyncPeers = 3

// reconnectPeers is how many members try to reconnect to a dead member
// (reconnectLoop).
const reconnectPeers = 3

// mix64 is splitmix64's finalizer (Steele, Lea and Flood 2014): FNV-1a
// alone scores names that differ in their last characters too alike.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// resyncers returns the k members of live (the members this node counts
// as up, back excluded) that resync with member back: the k highest
// scores of FNV-1a 64 (mixed) of "back/member", rendezvous hashing (Thaler and
// Ravishankar 1998), so every node that sees the same members picks the
// same ones, and the work of many returns spreads over the cluster.
func resyncers(back string, live []string, k int) []string {
	type scored struct {
		name  string
		score uint64
	}
	var s []scored
	for _, m := range live {
		if m == back {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(back + "/" + m))
		s = append(s, scored{m, mix64(h.Sum64())})
	}
	slices.SortFunc(s, func(a, b scored) int {
		if a.score != b.score {
			return cmp.Compare(b.score, a.score)
		}
		return strings.Compare(a.name, b.name)
	})
	out := make([]string, 0, k)
	for _, x := range s[:min(k, len(s))] {
		out = append(out, x.name)
	}
	return out
}

// resyncWith sends this node's digest to a member that came back, 1 s
// and 3 s after it did, while it stays alive: the member syncs the
// buckets that differ, both ways (syncDigest). A digest is 2 KiB
// whatever the cluster's size, where the push/pull (memberlist Join)
// these resyncs ran before also carried the whole member list both
// ways: 200 KB at 1,000 nodes, six times a return. A restarted member
// took the member list whole from its join's push/pull, and the others
// learn of its return from its alive message; a member back from a
// partition that still holds this node dead answers the digest with a
// push/pull (rejoinSender).
func (c *Cluster) resyncWith(name string) {
	c.resyncMu.Lock()
	c.resyncs[name]++
	c.resyncMu.Unlock()
	for _, wait := range []time.Duration{time.Second, 2 * time.Second} {
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(wait):
		}
		p, ok := c.peer(name)
		if !ok {
			return
		}
		c.sendDigest(p, "resync after rejoin")
	}
}

// rejoinSender runs a push/pull (memberlist Join) with name, in the
// background, when this node holds it dead, and reports whether it did.
// A digest from a member this node holds dead is a resync after a
// partition healed (resyncWith), sent before this node heard the
// sender's refutation: the push/pull carries both member lists, the
// refutations and the digests. At most maxConcurrentSyncs run at once
// (a flood of digests naming dead members costs no more).
func (c *Cluster) rejoinSender(name string) bool {
	c.membersMu.Lock()
	m, ok := c.members[name]
	var addr string
	if ok && m.State == StateDead {
		addr = net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port)))
	}
	c.membersMu.Unlock()
	if addr == "" {
		return false
	}
	select {
	case c.syncSem <- struct{}{}:
	default:
		return true
	}
	c.rejoins.Add(1)
	c.spawn(func() {
		defer func() { <-c.syncSem }()
		if _, err := c.ml.Join([]string{addr}); err != nil {
			c.log.Debug("rejoin of a dead member that sent a digest failed", "member", name, "err", err)
		}
	})
	return true
}

// NotifyLeave records a member declared dead, or that left.
func (d *delegate) NotifyLeave(n *memberlist.Node) {
	c := d.c
	c.membersMu.Lock()
	// n.State is never set by memberlist (see encodeLeave); the leave
	// intent, if it came first, tells a leave from a failure.
	state := StateDead
	if _, ok := c.leaving[n.Name]; ok {
		state = StateLeft
	}
	mv, moved := c.moved[n.Name]
	delete(c.moved, n.Name)
	moved = moved && state == StateDead && time.Since(mv.at) < movedFor && mv.addr != n.Address()
	if moved {
		// Its old run is dead, but a run of it (whose alive message
		// CheckAlive took: signed by its key) is up at mv.addr: held
		// suspect, which moves nothing, not dead, which would make
		// every node replace its replicas for the instant the push/pull
		// below takes (seen under load: copies ran twice for 11 s).
		state = StateSuspect
	}
	changed := c.setMemberLocked(n, state)
	c.membersMu.Unlock()
	if moved && c.gate.enter() {
		// The member came back at mv.addr while memberlist still held it
		// up at its old address: a push/pull with it now brings its
		// alive message in (memberlist takes a dead member's name at a
		// new address: DeadNodeReclaimTime). If that fails, it is dead.
		c.spawn(func() {
			if _, err := c.ml.Join([]string{mv.addr}); err != nil {
				c.log.Debug("contact of a member back at a new address failed", "member", n.Name, "addr", mv.addr, "err", err)
			}
			// The push/pull took its alive message (NotifyJoin: alive),
			// or it is dead after all.
			if c.setState(n.Name, StateDead, StateSuspect) {
				c.log.Info("member dead", "member", n.Name)
				c.notify()
			}
		})
		c.gate.exit()
	}
	c.coordsMu.Lock()
	delete(c.coords, n.Name)
	c.coordsMu.Unlock()
	c.vivaldi.ForgetNode(n.Name)
	if changed {
		c.log.Info("member "+string(state), "member", n.Name)
		c.notify()
	}
}

// NotifyAlive (memberlist.AliveDelegate) refuses an alive message that
// Config.CheckAlive refuses, and keeps each known member's delegate
// protocol maximum (which messages it reads: compress.go) as its alive
// messages say: a member that restarts on another version before it was
// declared dead refutes with a new alive message but triggers no join or
// update.
func (d *delegate) NotifyAlive(n *memberlist.Node) error {
	c := d.c
	if c.cfg.CheckAlive != nil {
		ip, ok := netip.AddrFromSlice(n.Addr)
		if !ok {
			c.refusedAlive.Add(1)
			return errMalformed
		}
		a := Alive{Name: n.Name, Addr: netip.AddrPortFrom(ip.Unmap(), n.Port), Meta: n.Meta}
		c.membersMu.Lock()
		if m, ok := c.members[n.Name]; ok {
			if ip, err := netip.ParseAddr(m.Addr); err == nil {
				a.HeldAddr = netip.AddrPortFrom(ip.Unmap(), m.Port)
			}
			a.HeldMeta = m.Meta // replaced, never changed in place
		}
		c.membersMu.Unlock()
		if err := c.cfg.CheckAlive(a); err != nil {
			c.refusedAlive.Add(1)
			return err
		}
	}
	c.membersMu.Lock()
	if m, ok := c.members[n.Name]; ok && m.node != nil && m.dmax != n.DMax {
		m.dmax = n.DMax
		m.setNode(m.node.Addr)
	}
	c.membersMu.Unlock()
	return nil
}

// NotifyUpdate records a member's new metadata or address; an update also
// means it is alive (it refuted any suspicion).
func (d *delegate) NotifyUpdate(n *memberlist.Node) {
	c := d.c
	c.membersMu.Lock()
	changed := c.setMemberLocked(n, StateAlive)
	c.membersMu.Unlock()
	if changed {
		c.log.Debug("member updated", "member", n.Name)
		c.notify()
	}
}

// NotifyConflict is memberlist's report of an alive message for a known
// name at another address while it holds the name up (or dead, without
// Config.CheckAlive) at its old one. It remembers another node claiming
// this node's own name (Join refuses to go on then). With
// Config.CheckAlive the message passed the check (NotifyAlive runs
// first), so it is the member itself at a new address, back from a
// crash before its old run was found dead: memberlist keeps the old
// address until then, and NotifyLeave then contacts the new one
// (Cluster.moved). Without the check it is a second node asking for a
// name in use, and memberlist keeps the first.
func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	c := d.c
	if existing.Name == c.cfg.Name {
		addr := other.Address()
		c.nameTakenBy.Store(&addr)
		c.log.Warn("another node uses this node's name: it was not admitted", "name", existing.Name, "other_addr", other.Address())
		return
	}
	if c.cfg.CheckAlive == nil {
		c.log.Warn("node name conflict: a second node asks for a name in use; keeping the first", "member", existing.Name,
			"addr", existing.Address(), "other_addr", other.Address())
		return
	}
	c.membersMu.Lock()
	prev, seen := c.moved[existing.Name]
	if _, known := c.members[existing.Name]; known && (seen || len(c.moved) < maxMoved) {
		c.moved[existing.Name] = moved{addr: other.Address(), at: time.Now()}
	}
	c.membersMu.Unlock()
	if !seen || prev.addr != other.Address() {
		c.log.Info("member is back at a new address; its old address stays until its earlier run is declared dead",
			"member", existing.Name, "addr", other.Address(), "was", existing.Address())
	}
}

// AckPayload returns this node's Vivaldi coordinate for a probe ack.
func (d *delegate) AckPayload() []byte {
	return encodeCoordinate(d.c.vivaldi.GetCoordinate())
}

// NotifyPingComplete feeds a direct probe's RTT and the peer's coordinate to
// the Vivaldi client. The ack also ends this node's suspicion of the peer.
func (d *delegate) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, payload []byte) {
	c := d.c
	if c.setState(other.Name, StateAlive, StateSuspect) {
		c.log.Info("member alive", "member", other.Name)
		c.notify()
	}
	if len(payload) == 0 {
		return
	}
	coord, err := decodeCoordinate(payload, c.coordDim)
	if err != nil {
		c.dropped("coordinate", err, "from", other.Name)
		return
	}
	if _, err := c.vivaldi.Update(other.Name, coord, rtt); err != nil {
		c.log.Debug("vivaldi update rejected", "member", other.Name, "rtt", rtt, "err", err)
		return
	}
	c.coordsMu.Lock()
	c.coords[other.Name] = coord
	c.coordsMu.Unlock()
}

// digestLoop sends this node's digest to a random live member every
// DigestInterval (with up to a quarter of jitter, so nodes started together
// do not send together); the member syncs what differs (syncDigest). This
// is anti-entropy at a fixed pace whatever the cluster's size: memberlist
// spaces its push/pulls out as the cluster grows.
func (c *Cluster) digestLoop() {
	for {
		wait := c.cfg.DigestInterval + time.Duration(rand.Int64N(int64(c.cfg.DigestInterval)/4+1))
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(wait):
		}
		peers := c.livePeers()
		if len(peers) == 0 {
			continue
		}
		p := peers[rand.IntN(len(peers))]
		msg := encodeDigest(digest{From: c.cfg.Name, Buckets: c.idx.sums()})
		if err := c.ml.SendReliable(p, msg); err != nil {
			c.log.Debug("digest exchange failed", "peer", p.Name, "err", err)
		}
	}
}
