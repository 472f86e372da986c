package gossip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/serf/coordinate"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"golang.org/x/time/rate"
)

const (
	// deltaOverhead is what memberlist adds around one of our messages in a
	// gossip packet at worst: compound header (2) and per-message overhead
	// (2), user-message type (1), encryption (29 for AES-GCM version 1), CRC
	// header (5), with room to spare (memberlist net.go, security.go).
	deltaOverhead = 64
	// maxQueuedDeltas bounds the delta queue. Under a burst of writes the
	// oldest (most retransmitted) deltas are dropped first; anti-entropy
	// delivers whatever they would have.
	maxQueuedDeltas = 4096
	// numKeyLocks stripes the per-key apply lock.
	numKeyLocks = 64
	// maxConcurrentSyncs bounds the anti-entropy exchanges this node starts
	// at once, and those it answers at once; a push/pull or request that
	// finds no free slot is skipped (the next push/pull repairs it).
	maxConcurrentSyncs = 4
	// maxPendingPulls bounds the announced records that this
	// node is pulling at once (have messages beyond it wait for the next
	// announcement or anti-entropy).
	maxPendingPulls = 64
	// pullAttempts bounds how often one announced record is asked for
	// (pullAnnounced: 250 ms, then doubling: about 8 s in all), from at
	// most maxAnnouncers of its holders in turn, at most
	// maxPullsInFlight at once.
	pullAttempts     = 5
	maxAnnouncers    = 4
	maxPullsInFlight = 8
	// directPeers is how many members a node sends a record it writes
	// to directly (pushToFew).
	directPeers = 3
)

// Cluster is a running member of a gossip cluster. Its methods are safe for
// concurrent use.
type Cluster struct {
	// askMu guards asks, the questions waiting for answers (ask.go).
	askMu  sync.Mutex
	askSeq uint64
	asks   map[uint64]pendingAsk

	cfg      Config
	log      *slog.Logger
	state    State
	ml       *memberlist.Memberlist
	keyring  *memberlist.Keyring // nil without encryption (keyring.go)
	queue    *memberlist.TransmitLimitedQueue
	idx      *index
	maxDelta int // largest delta message, type byte included, that is gossiped
	keyLocks [numKeyLocks]sync.Mutex

	membersMu sync.Mutex
	members   map[string]*Member
	leaving   map[string]time.Time // leave intents received, by node name
	live      atomic.Int64         // members not dead or left, self included

	metaMu sync.Mutex
	meta   []byte

	vivaldi  *coordinate.Client
	coordDim int
	coordsMu sync.Mutex
	coords   map[string]*coordinate.Coordinate

	changed chan struct{}

	ctx       context.Context // cancelled on shutdown
	cancel    context.CancelFunc
	wg        sync.WaitGroup // goroutines this Cluster started
	gate      gate           // delegate calls in flight
	syncSem   chan struct{}  // syncs this node started
	answerSem chan struct{}  // requests and pulls this node answers
	closed    atomic.Bool
	shutOnce  sync.Once
	shutErr   error

	dropLog rateLimiter
	// pulling are the announced records this node pulls, by key: the
	// entry asked for and since when (onHave).
	pullMu  sync.Mutex
	pulling map[string]pending
	pullSeq uint64        // the last pending.worker given out
	pullSem chan struct{} // pulls in flight
	// packetPulls bounds the pulls answered by packet (packetPullRate).
	packetPulls *rate.Limiter
	// pullsAnswered counts the pulls this node answered, and
	// packetAnswers those it answered with a packet, for tests.
	pullsAnswered, packetAnswers atomic.Int64
	// direct holds the writes waiting for the direct sends (push.go);
	// directSends counts the messages those sent, for tests.
	direct      directQueue
	directSends atomic.Int64
	// resyncs counts, by member, the resyncs run with it when it came
	// back (resyncWith), for tests.
	resyncMu sync.Mutex
	resyncs  map[string]int
	// afterJoin holds the members a digest is pending for after a join's
	// push/pull (digestAfterJoin): one at most per member, and at most
	// maxAfterJoin in all, however many push/pulls a key holder opens.
	afterJoinMu sync.Mutex
	afterJoin   map[string]bool
	// membersSnap is Members' sorted copy, nil after any change of
	// members (set under membersMu).
	membersSnap atomic.Pointer[[]Member]
	// reconnects counts reconnectLoop's attempts, and rejoins
	// rejoinSender's, for tests.
	reconnects, rejoins atomic.Int64
	// introduced is when the last introduction (Introduce) started,
	// introducing whether it still runs; introductions counts them, for
	// tests.
	introMu       sync.Mutex
	introduced    time.Time
	introducing   bool
	introductions atomic.Int64
	// pruned counts the deltas dropped from a full queue (DeltasPruned).
	pruned atomic.Int64
	// nameTakenBy is the address ("ip:port") of another node seen alive
	// under this node's name; nil if none.
	nameTakenBy atomic.Pointer[string]
	// moved holds, by name, the new address of a member whose alive
	// message (passed by Config.CheckAlive) gave another address while
	// memberlist still held it up at its old one: a node back from a
	// crash at a new address. When memberlist declares the old one dead,
	// a push/pull with the new address brings the member back at once
	// (NotifyLeave), where memberlist waited for the member's next
	// push/pull (30 s or more). Under membersMu, at most maxMoved.
	moved map[string]moved
	// refusedAlive counts the alive messages Config.CheckAlive refused.
	refusedAlive atomic.Int64
}

// moved is a member seen at a new address (Cluster.moved).
type moved struct {
	addr string // "ip:port"
	at   time.Time
}

// maxMoved bounds Cluster.moved (names come from peers); movedFor is
// how long an entry is acted on.
const (
	maxMoved = 256
	movedFor = 2 * time.Minute
)

// New starts memberlist on the configured address with state as the
// replicated map, and returns once it listens. It does not contact anyone:
// call Join. It reads state.Snapshot once to build the digest index. Errors
// wrap ErrConfig for a bad Config, or come from the snapshot or memberlist
// (for example an address already in use).
func New(cfg Config, state State) (*Cluster, error) {
	c, err := newCluster(cfg, state)
	if err != nil {
		return nil, err
	}
	logw := &logWriter{log: c.log, onSuspect: c.observeSuspect}
	mc, err := c.cfg.memberlistConfig(&delegate{c}, logw)
	if err != nil {
		c.cancel()
		return nil, err
	}
	if c.cfg.SignMeta != nil {
		if err := c.signMeta(mc); err != nil {
			c.cancel()
			return nil, err
		}
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		if c.cfg.SignMeta != nil && c.cfg.Transport == nil {
			mc.Transport.Shutdown()
		}
		c.cancel()
		return nil, fmt.Errorf("gossip: start memberlist: %w", err)
	}
	c.ml, c.keyring = ml, mc.Keyring
	c.spawn(c.reconnectLoop)
	if c.cfg.DigestInterval > 0 {
		c.spawn(c.digestLoop)
	}
	c.log.Info("gossip started", "addr", ml.LocalNode().Address(), "encrypted", len(c.cfg.SecretKey) > 0, "records", c.idx.len())
	return c, nil
}

// signMeta sets c.meta to Config.SignMeta of the address and port
// memberlist will advertise, before memberlist starts (its first alive
// message carries the metadata). That address is the transport's
// (memberlist.Transport.FinalAdvertiseAddr), so without Config.Transport
// it makes memberlist's network transport here, as memberlist.Create
// would, and hands it to mc.
func (c *Cluster) signMeta(mc *memberlist.Config) error {
	if mc.Transport == nil {
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: mc.Logger})
		if err != nil {
			return fmt.Errorf("gossip: start memberlist: %w", err)
		}
		if mc.BindPort == 0 {
			mc.BindPort = nt.GetAutoBindPort()
			mc.AdvertisePort = mc.BindPort
		}
		mc.Transport = nt
	}
	ip, port, err := mc.Transport.FinalAdvertiseAddr(mc.AdvertiseAddr, mc.AdvertisePort)
	addr, ok := netip.AddrFromSlice(ip)
	if err != nil || !ok || port <= 0 || port > 65535 {
		if c.cfg.Transport == nil {
			mc.Transport.Shutdown()
		}
		return fmt.Errorf("gossip: the address to advertise (%v, %d): %v", ip, port, err)
	}
	meta := c.cfg.SignMeta(netip.AddrPortFrom(addr.Unmap(), uint16(port)))
	if len(meta) > memberlist.MetaMaxSize {
		if c.cfg.Transport == nil {
			mc.Transport.Shutdown()
		}
		return fmt.Errorf("%w: signed meta is %d bytes, max %d", ErrConfig, len(meta), memberlist.MetaMaxSize)
	}
	c.metaMu.Lock()
	c.meta = meta
	c.metaMu.Unlock()
	return nil
}

// newCluster builds a Cluster without starting memberlist (c.ml is nil):
// New's first half, and the harness of tests that drive the delegate alone.
func newCluster(cfg Config, state State) (*Cluster, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if state == nil {
		return nil, fmt.Errorf("%w: nil State", ErrConfig)
	}
	ccfg := coordinate.DefaultConfig()
	viv, err := coordinate.NewClient(ccfg)
	if err != nil {
		return nil, fmt.Errorf("gossip: vivaldi: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cluster{
		cfg:         cfg,
		log:         cfg.Logger.With("node", cfg.Name),
		state:       state,
		idx:         newIndex(),
		maxDelta:    cfg.UDPBufferSize - deltaOverhead,
		members:     map[string]*Member{},
		moved:       map[string]moved{},
		resyncs:     map[string]int{},
		afterJoin:   map[string]bool{},
		pulling:     map[string]pending{},
		asks:        map[uint64]pendingAsk{},
		askSeq:      rand.Uint64(),
		pullSem:     make(chan struct{}, maxPullsInFlight),
		packetPulls: rate.NewLimiter(packetPullRate, packetPullRate),
		leaving:     map[string]time.Time{},
		meta:        slices.Clone(cfg.Meta),
		vivaldi:     viv,
		coordDim:    int(ccfg.Dimensionality),
		coords:      map[string]*coordinate.Coordinate{},
		changed:     make(chan struct{}, 1),
		ctx:         ctx,
		cancel:      cancel,
		syncSem:     make(chan struct{}, maxConcurrentSyncs),
		answerSem:   make(chan struct{}, maxConcurrentSyncs),
		dropLog:     rateLimiter{interval: time.Second},
	}
	c.queue = &memberlist.TransmitLimitedQueue{
		NumNodes:       func() int { return int(c.live.Load()) },
		RetransmitMult: cfg.RetransmitMult,
	}
	if err := c.Reindex(); err != nil {
		cancel()
		return nil, err
	}
	return c, nil
}

// reconnectLoop tries, every ReconnectInterval, to rejoin one random member
// that died less than ReconnectTimeout ago and that this node is one of
// the reconnectPeers reconnecters of this interval (resyncers over the
// members it sees alive, drawn again each interval). A push/pull with it
// makes both sides refute the other's "dead" verdict, and the next one
// (or gossip) carries the refutations across; see serf.go
// handleReconnect. In serf every member tries: with D members dead, each
// draws about N/D attempts an interval, and one that comes back draws a
// push/pull from each member whose tick falls before it hears the member
// is alive (at 300 simulated nodes a return cost about 290 push/pulls in
// its first minute, against about 120 of an idle minute). After a
// partition each member of one side is tried by 3 of the other's each
// interval.
func (c *Cluster) reconnectLoop() {
	t := time.NewTicker(c.cfg.ReconnectInterval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		type dead struct{ name, addr string }
		var live []string
		var gone []dead
		c.membersMu.Lock()
		for name, m := range c.members {
			switch {
			case m.State == StateAlive:
				live = append(live, name)
			case m.State == StateDead && time.Since(m.Since) < c.cfg.ReconnectTimeout:
				gone = append(gone, dead{name, net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port)))})
			}
		}
		c.membersMu.Unlock()
		// The reconnecters change every interval: three members that
		// cannot reach a dead one (a one-way cut) do not keep it away.
		epoch := strconv.FormatInt(time.Now().UnixNano()/int64(c.cfg.ReconnectInterval), 10)
		var cands []string
		for _, d := range gone {
			if slices.Contains(resyncers(d.name+"@"+epoch, live, reconnectPeers), c.cfg.Name) {
				cands = append(cands, d.addr)
			}
		}
		if len(cands) == 0 {
			continue
		}
		addr := cands[rand.IntN(len(cands))]
		c.reconnects.Add(1)
		if _, err := c.ml.Join([]string{addr}); err != nil {
			c.log.Debug("reconnect failed", "addr", addr, "err", err)
		} else {
			c.log.Debug("reconnected", "addr", addr)
		}
	}
}

// Reindex rebuilds the digest index from State.Snapshot. Call it after
// changing the State other than through this Cluster. Writes wait while it
// runs.
func (c *Cluster) Reindex() error {
	for i := range c.keyLocks {
		c.keyLocks[i].Lock()
	}
	defer func() {
		for i := range c.keyLocks {
			c.keyLocks[i].Unlock()
		}
	}()
	snap, err := c.state.Snapshot()
	if err != nil {
		return fmt.Errorf("gossip: snapshot state: %w", err)
	}
	if err := c.idx.reset(snap); err != nil {
		return fmt.Errorf("gossip: index state: %w", err)
	}
	return nil
}

// LocalName returns this node's name (Config.Name).
func (c *Cluster) LocalName() string { return c.cfg.Name }

// NumMembers returns the number of members not dead or left (alive or
// suspect), this node included.
func (c *Cluster) NumMembers() int { return int(c.live.Load()) }

// Changed returns a channel that receives a value, without blocking the
// sender and coalesced in a buffer of 1, whenever membership changes or a
// record received from another node was applied. It is never closed.
func (c *Cluster) Changed() <-chan struct{} { return c.changed }

func (c *Cluster) notify() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// Join contacts the seeds ("host" or "host:port"; the port defaults to
// BindPort) and merges state with each that answers, then returns how many
// did. It fails only if none answered; if the seeds answered but nothing
// could be decrypted either way, the error wraps ErrKeyMismatch.
func (c *Cluster) Join(seeds []string) (int, error) {
	if c.closed.Load() {
		return 0, ErrClosed
	}
	if len(seeds) == 0 {
		return 0, errors.New("gossip: join: no seeds")
	}
	c.nameTakenBy.Store(nil)
	n, err := c.ml.Join(seeds)
	if other := c.nameTakenBy.Load(); other != nil {
		// The cluster already has a live member of this name: a node
		// that joins must not displace it (the push/pull of the join
		// showed it; memberlist kept the existing member).
		return n, fmt.Errorf("gossip: join %s: %w: %q is alive at %s", strings.Join(seeds, ","), ErrNameTaken, c.cfg.Name, *other)
	}
	if err != nil {
		if isKeyError(err) {
			return n, fmt.Errorf("gossip: join %s: %w (%v)", strings.Join(seeds, ","), ErrKeyMismatch, err)
		}
		return n, fmt.Errorf("gossip: join %s: %w", strings.Join(seeds, ","), err)
	}
	c.log.Info("joined", "seeds", seeds, "answered", n, "members", c.NumMembers())
	return n, nil
}

// isKeyError recognises memberlist's errors for undecryptable exchanges
// (memberlist security.go and net.go readStream). memberlist returns them as
// plain strings, so there is nothing better to match.
func isKeyError(err error) bool {
	s := err.Error()
	for _, m := range []string{
		"no installed keys could decrypt the message",
		"encryption is configured but remote state is not encrypted",
		"remote state is encrypted and encryption is not configured",
	} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// Publish applies r to the local State and, if that changed it, sends it to
// the cluster: as a gossiped delta when its encoding is at most
// Config.AnnounceAbove bytes, otherwise announced (a have message) and
// pulled by the others from a holder. A write that loses to the record already held
// is not sent. Errors: r fails crdt.Record.Validate (wraps
// crdt.ErrInvalidRecord), State.Apply failed, or ErrClosed.
func (c *Cluster) Publish(r crdt.Record) error {
	enc, err := crdt.EncodeRecord(r)
	if err != nil {
		return fmt.Errorf("gossip: publish %s: %w", r.Key, err)
	}
	if !c.gate.enter() {
		return ErrClosed
	}
	defer c.gate.exit()
	changed, err := c.apply(r, enc, true)
	if err != nil {
		return fmt.Errorf("gossip: publish %s: %w", r.Key, err)
	}
	if changed {
		c.pushToFew(r, enc)
	}
	return nil
}

// apply merges r (encoded as enc) into the State and the index under the
// key's lock, and queues it as a delta when it changed the State, requeue is
// set and it is no longer than Config.AnnounceAbove; a longer one is
// announced (have) instead. Holding the key lock across Apply and the
// queueing keeps the index, and the delta queue (which replaces a key's
// queued delta by name), in the State's order.
func (c *Cluster) apply(r crdt.Record, enc []byte, requeue bool) (bool, error) {
	l := &c.keyLocks[keyHash(r.Key)%numKeyLocks]
	l.Lock()
	defer l.Unlock()
	changed, err := c.state.Apply(r)
	if err != nil || !changed {
		return false, err
	}
	e := entryOf(r, enc)
	c.idx.put(e)
	// A pull of this version or an older one ends, whatever the size of
	// what came.
	c.pullMu.Lock()
	p, pulled := c.pulling[r.Key]
	pulled = pulled && compareEntries(e, p.e) >= 0
	if pulled {
		delete(c.pulling, r.Key)
		close(p.arrived)
	}
	c.pullMu.Unlock()
	switch {
	case 1+len(enc) > c.maxDelta:
		// Too large for a delta: announced, however it came (this node
		// can serve it now).
		c.announce(e)
	case len(enc) > c.cfg.AnnounceAbove && (requeue || pulled):
		// Announced where a delta would be gossiped on, and when it
		// answers this node's pull: the pull of an announcement is how
		// the announcement spreads. A record a digest sync repaired is
		// old news, as it is for a delta.
		c.announce(e)
	case requeue:
		c.queue.QueueBroadcast(&broadcast{key: r.Key, msg: encodeDelta(enc)})
	}
	if n := c.queue.NumQueued(); n > maxQueuedDeltas {
		c.queue.Prune(maxQueuedDeltas)
		c.pruned.Add(int64(n - maxQueuedDeltas))
	}
	return true, nil
}

// receive applies a record from another node; forward re-queues it as a
// delta when it changed the State.
func (c *Cluster) receive(r crdt.Record, enc []byte, forward bool) {
	// A copy of what is held, or an older write, changes nothing: skip it
	// before the (costly) Accept check. Gossip delivers each delta to a
	// node several times.
	if held, ok := c.idx.get(r.Key); ok {
		if in := entryOf(r, enc); compareEntries(held, in) > 0 || held == in {
			return
		}
	}
	if c.cfg.Accept != nil {
		if err := c.cfg.Accept(r); err != nil {
			c.log.Debug("record refused", "key", r.Key, "origin", r.Origin, "err", err)
			return
		}
	}
	if c.cfg.Clock != nil {
		if _, err := c.cfg.Clock.Update(r.Version); err != nil {
			c.dropped("record from the future", err, "key", r.Key, "origin", r.Origin)
			return
		}
	}
	changed, err := c.apply(r, enc, forward)
	if err != nil {
		c.log.Error("apply remote record", "key", r.Key, "origin", r.Origin, "err", err)
		return
	}
	if changed {
		c.notify()
	}
}

// idxEntry returns the index entry of key, or the zero entry.
func (c *Cluster) idxEntry(key string) entry {
	e, _ := c.idx.get(key)
	return e
}

// dropped logs a rejected message, at most once a second.
func (c *Cluster) dropped(what string, err error, kv ...any) {
	ok, suppressed := c.dropLog.allow(time.Now())
	if !ok {
		return
	}
	args := append([]any{"err", err}, kv...)
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	if err == errNotMember {
		c.log.Debug("gossip: dropped "+what, args...)
		return
	}
	c.log.Warn("gossip: dropped "+what, args...)
}

// Records longer than Config.AnnounceAbove (a node record; a typical
// manifest is over the 1,336 bytes of a LAN packet) spread by
// announcement: a node that holds one gossips a small have message
// naming it and itself; a node that lacks it pulls it from the
// announcer (one packet each way when it fits one, else over TCP), then
// announces it in turn.
// The writer serves the first few pulls and each holder a few more, so
// a write reaches N nodes in O(log N) gossip rounds with O(1)
// connections per node, where sending it to every member took N-1
// connections from the writer (999 per write at 1,000 nodes).

// announce queues a have message for entry e (held by this node). It
// replaces a queued delta or have of the same key, which it is newer
// than.
func (c *Cluster) announce(e entry) {
	c.queue.QueueBroadcast(&broadcast{key: e.Key, msg: encodeHave(have{From: c.cfg.Name, E: e})})
}

// pending is the pull of an announced record: the newest entry announced
// and the members that announced it (at most maxAnnouncers, newest last).
// One worker (pullAnnounced) runs per key.
type pending struct {
	e    entry
	from []string
	// worker identifies the pullAnnounced that serves this entry: a
	// worker that outlives its entry (the record arrived, a new have
	// made a new entry) must not act for, or delete, the next one.
	worker uint64
	// arrived is closed when the record arrives: the worker stops at
	// once, where waiting out its backoff kept thousands of workers
	// parked at 1,000 simulated nodes.
	arrived chan struct{}
}

// onHave has the record h announces pulled, unless this node holds it or
// a newer one. A have for a key already being pulled only updates what
// the pull asks for and from whom. A have from a non-member, or with a
// version further ahead than the clock accepts (hlc.MaxOffset), is
// dropped: it would hold a pull slot for nothing.
func (c *Cluster) onHave(h have) {
	if h.From == c.cfg.Name {
		return
	}
	if time.Unix(0, h.E.Version.Wall).After(time.Now().Add(hlc.MaxOffset)) {
		c.dropped("have from the future", errMalformed, "from", h.From, "key", h.E.Key)
		return
	}
	if _, ok := c.peer(h.From); !ok {
		c.dropped("have from a non-member", errNotMember, "from", h.From)
		return
	}
	if held, ok := c.idx.get(h.E.Key); ok && (compareEntries(held, h.E) > 0 || held == h.E) {
		return
	}
	c.pullMu.Lock()
	defer c.pullMu.Unlock()
	p, ok := c.pulling[h.E.Key]
	switch {
	case ok && (compareEntries(h.E, p.e) > 0 || h.E != p.e && compareEntries(h.E, p.e) == 0):
		c.pulling[h.E.Key] = pending{e: h.E, from: []string{h.From}, worker: p.worker, arrived: p.arrived}
		return
	case ok && h.E == p.e:
		if !slices.Contains(p.from, h.From) {
			p.from = append(p.from, h.From)
			if len(p.from) > maxAnnouncers {
				p.from = p.from[1:]
			}
			c.pulling[h.E.Key] = p
		}
		return
	case ok:
		return // an older version than the one being pulled
	case len(c.pulling) >= maxPendingPulls:
		return // the next announcement or anti-entropy
	}
	c.pullSeq++
	worker := c.pullSeq
	c.pulling[h.E.Key] = pending{e: h.E, from: []string{h.From}, worker: worker, arrived: make(chan struct{})}
	c.log.Debug("pulling an announced record", "key", h.E.Key, "version", h.E.Version, "from", h.From)
	c.spawn(func() { c.pullAnnounced(h.E.Key, worker) })
}

// pullAnnounced asks for the record of key, as its pending entry says,
// until it arrives (apply ends the pending pull) or pullAttempts were
// made: each attempt asks the next announcer in turn, through at most
// maxPullsInFlight pulls of this node, and waits 250 ms doubling,
// with jitter. A lost pull (a busy or dead announcer, a dropped
// connection) is asked again of another holder, not left to
// anti-entropy, whose interval grows with the cluster; announcements are
// sent only a few times each, so none may come again.
func (c *Cluster) pullAnnounced(key string, worker uint64) {
	defer func() {
		c.pullMu.Lock()
		if p, ok := c.pulling[key]; ok && p.worker == worker {
			delete(c.pulling, key)
		}
		c.pullMu.Unlock()
	}()
	wait := 250 * time.Millisecond
	for attempt := 0; attempt < pullAttempts; attempt++ {
		c.pullMu.Lock()
		p, ok := c.pulling[key]
		c.pullMu.Unlock()
		if !ok || p.worker != worker {
			return // arrived (or another worker pulls a later announcement)
		}
		if held, ok := c.idx.get(key); ok && (compareEntries(held, p.e) > 0 || held == p.e) {
			return
		}
		if to, ok := c.peer(p.from[attempt%len(p.from)]); ok {
			select {
			case c.pullSem <- struct{}{}:
			case <-p.arrived:
				return
			case <-c.ctx.Done():
				return
			}
			// A pull is one small packet (answerPullByPacket answers
			// with one when the record fits); the attempts cover a lost
			// one.
			err := c.ml.SendBestEffort(to, encodePull(pull{From: c.cfg.Name, Keys: []string{key}}))
			<-c.pullSem
			if err != nil {
				c.log.Debug("pull of an announced record failed", "key", key, "from", to.Name, "err", err)
			}
		}
		jittered := wait/2 + time.Duration(rand.Int64N(int64(wait)))
		select {
		case <-c.ctx.Done():
			return
		case <-p.arrived:
			return
		case <-time.After(jittered):
		}
		wait *= 2
	}
	c.log.Debug("announced record did not arrive; anti-entropy will repair", "key", key)
}

// spawn runs f in a goroutine owned by c: Shutdown waits for it.
func (c *Cluster) spawn(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}

// livePeers returns the members other than this node that are alive or
// suspect, as memberlist nodes to send to.
func (c *Cluster) livePeers() []*memberlist.Node {
	c.membersMu.Lock()
	defer c.membersMu.Unlock()
	var out []*memberlist.Node
	for _, m := range c.members {
		if m.Name != c.cfg.Name && (m.State.Up()) {
			out = append(out, m.node)
		}
	}
	return out
}

// peer returns the member name as a memberlist node to send to, if it is
// known and not dead or left.
func (c *Cluster) peer(name string) (*memberlist.Node, bool) {
	c.membersMu.Lock()
	defer c.membersMu.Unlock()
	m, ok := c.members[name]
	if !ok || name == c.cfg.Name || !m.State.Up() {
		return nil, false
	}
	return m.node, true
}

// Ping sends one direct UDP ping (memberlist's probe message) to the named
// member and waits up to the probe timeout for the ack. It returns the
// round trip, or an error when the member is unknown, dead or left, or did
// not answer. Unlike the failure detector's probes (one member per probe
// interval, slowed down by Lifeguard when this node is unhealthy), the
// caller decides how often each member is asked.
func (c *Cluster) Ping(name string) (time.Duration, error) {
	n, ok := c.peer(name)
	if !ok {
		return 0, fmt.Errorf("ping %s: not a live member", name)
	}
	return c.ml.Ping(name, &net.UDPAddr{IP: n.Addr, Port: int(n.Port)})
}

// Member returns member name as this node sees it (ok false when it is
// not a member). It copies one entry.
func (c *Cluster) Member(name string) (Member, bool) {
	c.membersMu.Lock()
	defer c.membersMu.Unlock()
	m, ok := c.members[name]
	if !ok {
		return Member{}, false
	}
	cp := *m
	cp.Meta = slices.Clone(m.Meta)
	return cp, true
}

// RefusedAlive returns how many alive messages Config.CheckAlive refused.
func (c *Cluster) RefusedAlive() int64 { return c.refusedAlive.Load() }

// DeltasPruned is the number of deltas this node dropped from its full
// queue before sending them as often as it should (anti-entropy
// delivers them later).
func (c *Cluster) DeltasPruned() int64 { return c.pruned.Load() }

// State returns member name's state as this node sees it (ok false when
// it is not a member). Unlike Member it copies nothing.
func (c *Cluster) State(name string) (MemberState, bool) {
	c.membersMu.Lock()
	defer c.membersMu.Unlock()
	m, ok := c.members[name]
	if !ok {
		return "", false
	}
	return m.State, true
}

// Members returns every member this node has seen, with its state, sorted by
// name, this node included. Dead and left members stay listed; one that comes
// back is alive again.
//
// The slice is a snapshot shared by every caller until the membership
// changes: callers must not modify it or its members' Meta. (Every loop
// of a node reads it, several times a second; at 1,000 simulated nodes
// copying and sorting it per call was 30 % of the CPU.)
func (c *Cluster) Members() []Member {
	if p := c.membersSnap.Load(); p != nil {
		return *p
	}
	c.membersMu.Lock()
	defer c.membersMu.Unlock()
	if p := c.membersSnap.Load(); p != nil {
		return *p
	}
	out := make([]Member, 0, len(c.members))
	for _, m := range c.members {
		cp := *m
		cp.Meta = slices.Clone(m.Meta)
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	c.membersSnap.Store(&out)
	return out
}

// SameSnapshot reports whether a and b are one membership snapshot
// (Members shares one until membership changes): a cheap test that
// nothing changed, without comparing members.
func SameSnapshot(a, b []Member) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// upSinceLocked returns the names of the members that are alive or
// suspect and have been since t or earlier, this node included, sorted.
// Called with membersMu held.
func (c *Cluster) upSinceLocked(t time.Time) []string {
	var out []string
	for name, m := range c.members {
		if m.State.Up() && !m.Since.After(t) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// setMemberLocked updates the member's entry (creating it) and the live count, and
// reports whether anything visible changed. Called with membersMu held.
func (c *Cluster) setMemberLocked(n *memberlist.Node, state MemberState) bool {
	m, ok := c.members[n.Name]
	if !ok {
		m = &Member{Name: n.Name}
		c.members[n.Name] = m
	}
	changed := !ok
	if addr := n.Addr.String(); m.Addr != addr || m.Port != n.Port || m.dmax != n.DMax || m.node == nil {
		// dmax is what it reads, not a change of the member.
		changed = changed || m.Addr != addr || m.Port != n.Port
		m.Addr, m.Port, m.dmax = addr, n.Port, n.DMax
		m.setNode(slices.Clone(n.Addr))
	}
	if !slices.Equal(m.Meta, n.Meta) {
		m.Meta, changed = slices.Clone(n.Meta), true
	}
	if m.State != state {
		m.State, m.Since, changed = state, time.Now(), true
	}
	if changed {
		// An alive message that changes nothing (gossip repeats each
		// many times) keeps the Members snapshot.
		c.recountLocked()
	}
	return changed
}

// recountLocked follows a change of members: it counts the live ones and
// drops the Members snapshot. Called with membersMu held.
func (c *Cluster) recountLocked() {
	c.membersSnap.Store(nil)
	n := 0
	for _, m := range c.members {
		if m.State.Up() {
			n++
		}
	}
	c.live.Store(int64(n))
}

// setState changes only the state of a known member, if it is in one of
// from; it reports whether it did.
func (c *Cluster) setState(name string, to MemberState, from ...MemberState) bool {
	c.membersMu.Lock()
	defer c.membersMu.Unlock()
	m, ok := c.members[name]
	if !ok || m.State == to || !slices.Contains(from, m.State) {
		return false
	}
	m.State, m.Since = to, time.Now()
	c.recountLocked()
	return true
}

// observeSuspect is called when memberlist reports that this node's probe of
// name got no ack.
func (c *Cluster) observeSuspect(name string) {
	if name != c.cfg.Name && c.setState(name, StateSuspect, StateAlive) {
		c.log.Info("member suspect", "member", name)
		c.notify()
	}
}

// RTT returns the round-trip time to the named node estimated from Vivaldi
// network coordinates, and false if this node has not yet received that
// node's coordinate (it arrives with the acks of this node's probes, so
// within about N probe intervals). The estimate for this node itself is 0.
func (c *Cluster) RTT(name string) (time.Duration, bool) {
	if name == c.cfg.Name {
		return 0, true
	}
	c.coordsMu.Lock()
	other, ok := c.coords[name]
	c.coordsMu.Unlock()
	if !ok {
		return 0, false
	}
	return c.vivaldi.DistanceTo(other), true
}

// UpdateMeta replaces this node's metadata (at most 512 bytes) and gossips it
// with an alive message. It waits up to two gossip intervals for the first
// transmission; after that the message still spreads in the background.
// Errors wrap ErrConfig for oversized meta, or ErrClosed.
func (c *Cluster) UpdateMeta(meta []byte) error {
	if len(meta) > memberlist.MetaMaxSize {
		return fmt.Errorf("%w: meta is %d bytes, max %d", ErrConfig, len(meta), memberlist.MetaMaxSize)
	}
	if !c.gate.enter() {
		return ErrClosed
	}
	defer c.gate.exit()
	c.metaMu.Lock()
	c.meta = slices.Clone(meta)
	c.metaMu.Unlock()
	if err := c.ml.UpdateNode(2 * c.cfg.GossipInterval); err != nil {
		// memberlist only fails here on its wait timing out; the alive
		// message stays queued.
		c.log.Debug("meta update still spreading", "err", err)
	}
	return nil
}

// Leave announces a graceful leave, so that peers mark this node "left"
// rather than "dead", then shuts down as Shutdown does. It gossips a leave
// intent, waiting up to timeout/2 for it to be sent, then memberlist's leave
// message, waiting for the rest of timeout (at least 100 ms). It returns the error of that wait (the node shuts
// down anyway), or ErrClosed if already shut down.
func (c *Cluster) Leave(timeout time.Duration) error {
	if c.closed.Load() {
		return ErrClosed
	}
	c.cancel() // stop reconnecting and syncing first
	deadline := time.Now().Add(timeout)
	sent := make(chan struct{}, 1)
	c.queue.QueueBroadcast(&broadcast{key: leaveKey(c.cfg.Name), msg: encodeLeave(c.cfg.Name), sent: sent})
	var err error
	if c.live.Load() > 1 {
		select {
		case <-sent:
		case <-time.After(timeout / 2):
			err = errors.New("timeout waiting for the leave intent to be sent")
		}
	}
	// memberlist.Leave waits forever for a zero timeout: keep a floor.
	if lerr := c.ml.Leave(max(time.Until(deadline), 100*time.Millisecond)); lerr != nil && err == nil {
		err = lerr
	}
	c.setState(c.cfg.Name, StateLeft, StateAlive, StateSuspect)
	c.log.Info("left cluster", "err", err)
	if serr := c.Shutdown(); serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("gossip: leave: %w", err)
	}
	return nil
}

// leaveKey names the broadcast of a node's leave intent; it is not a valid
// record key, so it never replaces a delta.
func leaveKey(name string) string { return "/leave/" + name }

// observeLeave records another node's intent to leave, marks it left if it
// was already seen dead, and gossips the intent on the first time it is seen.
func (c *Cluster) observeLeave(name string, msg []byte) {
	if name == c.cfg.Name {
		return
	}
	c.membersMu.Lock()
	if _, seen := c.leaving[name]; seen {
		c.membersMu.Unlock()
		return
	}
	now := time.Now()
	c.leaving[name] = now
	changed := false
	if m, ok := c.members[name]; ok && m.State == StateDead {
		m.State, m.Since, changed = StateLeft, now, true
		c.membersSnap.Store(nil)
	}
	c.membersMu.Unlock()
	c.queue.QueueBroadcast(&broadcast{key: leaveKey(name), msg: slices.Clone(msg)})
	if changed {
		c.log.Info("member left", "member", name)
		c.notify()
	}
}

// Shutdown stops gossiping without announcing it: peers detect a failure, as
// for a crash. It waits for this package's goroutines and for the delegate
// calls in progress, so that State is not used after it returns; an exchange
// in progress can make that take up to TCPTimeout. It is safe to call more
// than once.
func (c *Cluster) Shutdown() error {
	c.shutOnce.Do(func() {
		c.closed.Store(true)
		c.cancel()
		if c.ml != nil {
			c.shutErr = c.ml.Shutdown()
		}
		c.gate.close()
		c.wg.Wait()
		c.queue.Reset()
		c.log.Info("gossip stopped")
	})
	return c.shutErr
}

// gate counts calls in progress and refuses new ones once closed.
type gate struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	return true
}

func (g *gate) exit() { g.wg.Done() }

// close refuses new calls and waits for those in progress.
func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.wg.Wait()
}

// broadcast is one queued delta or leave intent. It is a
// memberlist.NamedBroadcast named by its key, so that queueing a newer delta
// of a key drops the older one.
type broadcast struct {
	key  string
	msg  []byte
	sent chan struct{} // if not nil, receives when the queue is done with it
}

func (b *broadcast) Message() []byte { return b.msg }
func (b *broadcast) Name() string    { return b.key }

// Finished is called by the queue once b was sent its last time, or was
// dropped.
func (b *broadcast) Finished() {
	if b.sent != nil {
		select {
		case b.sent <- struct{}{}:
		default:
		}
	}
}

// Invalidates reports whether b replaces other: a delta of the same key.
// memberlist uses Name for NamedBroadcasts; this is its documented
// equivalent.
func (b *broadcast) Invalidates(other memberlist.Broadcast) bool {
	nb, ok := other.(memberlist.NamedBroadcast)
	return ok && nb.Name() == b.key
}
