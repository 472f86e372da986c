package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-orchestrator/starling/node/damping"
	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/api"
)

// Store meta keys.
const (
	metaName     = "node-name"
	metaPeers    = "peers"     // JSON list of "ip:port" of members last seen alive
	metaLastSeen = "last-seen" // RFC 3339 time the node last had the cluster's state
)

// members is this node's membership: joining the cluster, knowing when it
// holds the cluster's state (synced), and which members count as alive
// for placement (flap damping, package damping).
type members struct {
	self   string
	join   []string // --join
	settle time.Duration
	ttl    time.Duration // --tombstone-ttl
	// bootGrace is how long failed joins last before the node acts on
	// its local state alone (--failover-timeout).
	bootGrace time.Duration
	store     Store
	// certified reports whether a member is a node (memberAuth.certified;
	// nil: every member is): only nodes are asked how long they settle
	// this one.
	certified certifier
	cluster   *gossip.Cluster
	log       *slog.Logger
	// keys refreshes the gossip keys after a rotation this node missed
	// (nil with --insecure).
	keys *trust.Keyring
	// fenceTimeout is how long a forgotten node keeps its replicas
	// (--fence-timeout); stopReplicas is closed then (the agent stops
	// them: replicas.stopAll).
	fenceTimeout time.Duration
	stopReplicas chan struct{}
	// droppedState: the node was away longer than the tombstone TTL and
	// discarded its desired state; it must resync before acting.
	droppedState bool

	synced   chan struct{} // closed once the node holds the cluster's state
	syncOnce sync.Once

	// Flaps is the flap damping: which members count as alive for
	// placement (AliveAfter, for the view) and this node's own settling.
	*damping.Flaps
}

// newMembers returns the membership of node cfg.Name on gossip cluster
// (nil in tests of its pure parts), whose certified members are nodes,
// refreshing gossip keys through keys (nil with --insecure); dropped: it
// discarded its desired state at start (staleState).
func newMembers(cfg Config, st Store, cluster *gossip.Cluster, certified certifier, keys *trust.Keyring, dropped bool, log *slog.Logger) *members {
	return &members{self: cfg.Name, join: cfg.Join, settle: cfg.RejoinSettle, ttl: cfg.TombstoneTTL, bootGrace: cfg.FailoverTimeout, fenceTimeout: cfg.FenceTimeout, store: st, log: log,
		cluster: cluster, certified: certified, keys: keys, droppedState: dropped,
		synced: make(chan struct{}), stopReplicas: make(chan struct{}), Flaps: damping.New(cfg.Name, cfg.RejoinSettle, log)}
}

// checkIdentity binds the data dir to the node name on first start and
// refuses a different name later: a node's identity is what peers and
// placement know it by.
func checkIdentity(st Store, name, dataDir string) error {
	held, ok, err := st.GetMeta(metaName)
	if err != nil {
		return err
	}
	if !ok {
		return st.PutMeta(metaName, []byte(name))
	}
	if string(held) != name {
		return fmt.Errorf("--data-dir %s belongs to node %q: start with --name %s, or use a fresh --data-dir", dataDir, held, held)
	}
	return nil
}

// staleState reports whether this node was away longer than the tombstone
// TTL ttl, by the last-seen time in st: peers may have purged tombstones
// it never saw.
func staleState(st Store, ttl time.Duration) bool {
	v, ok, err := st.GetMeta(metaLastSeen)
	if err != nil || !ok {
		return false
	}
	t, err := time.Parse(time.RFC3339, string(v))
	return err == nil && time.Since(t) > ttl
}

func (m *members) markSeen() {
	if err := m.store.PutMeta(metaLastSeen, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		m.log.Warn("record last-seen time", "err", err)
	}
}

// targets are the seeds from --join, in order, then the peers last seen
// alive, shuffled (joinTargets).
func (m *members) targets() []string { return joinTargets(m.join, m.store) }

// joinTargets are the seeds join, in order, then the peers last seen
// alive (held in st), shuffled (joinSome asks a few at a time, so every
// restarted node does not ask the same ones).
func joinTargets(join []string, st Store) []string {
	seen := map[string]bool{}
	var out []string
	add := func(s string) {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	for _, s := range join {
		add(s)
	}
	if b, ok, err := st.GetMeta(metaPeers); err == nil && ok {
		var peers []string
		if json.Unmarshal(b, &peers) == nil {
			rand.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
			for _, p := range peers {
				add(p)
			}
		}
	}
	return out
}

// joinFanout is how many targets a join exchanges state with at once.
// memberlist's Join runs a full push/pull (every member and this node's
// digest, both ways) with each address it is given: a restarted node of
// a 300-node cluster that joined through every peer it had seen ran 299
// of them, about 20 MB, where one brings the whole state. Three keep the
// join going when a remembered peer is gone or slow.
const joinFanout = 3

// joinSome joins through targets joinFanout at a time, in order, until a
// batch reaches at least one member; it returns how many it reached and
// the errors of the batches that reached none. ErrNameTaken ends it at
// once; a key mismatch (one stale or foreign target marks its whole
// batch) does not: the next batch may hold a member with the right key,
// and the caller refreshes the keys only when none did.
func joinSome(join func([]string) (int, error), targets []string) (int, error) {
	var errs []error
	for i := 0; i < len(targets); i += joinFanout {
		n, err := join(targets[i:min(i+joinFanout, len(targets))])
		if n > 0 || errors.Is(err, gossip.ErrNameTaken) {
			return n, err
		}
		errs = append(errs, err)
	}
	return 0, errors.Join(errs...)
}

// joinLoop joins the cluster through any target, retrying with backoff
// (1 s doubling to 30 s) until one answers. With no target the node starts
// a cluster of its own. It closes synced once the node holds the
// cluster's state (after the first successful join's push/pull, once
// the records it brings have arrived when the node dropped stale state,
// at once when there is nothing to join, or after --failover-timeout of
// failed joins when its local state is recent). changed wakes it while
// it waits for those records (waitForState). A node back from a crash
// waits for them in its replica loop (replicas.loop).
func (m *members) joinLoop(ctx context.Context, changed func() <-chan struct{}) {
	targets := m.targets()
	// returning: a node that was a member before (it holds the peers it
	// saw) may have had its replicas replaced while it was away.
	_, returning, _ := m.store.GetMeta(metaPeers)
	if len(targets) == 0 {
		m.log.Info("no seeds to join: starting a new cluster")
		m.markSynced()
		return
	}
	backoff := time.Second
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
		return true
	}
	// A node whose name a live node uses never acts (see below), grace
	// or not; nor does a node its peers say was forgotten.
	var nameTaken, forgotten atomic.Bool
	if !m.droppedState {
		// Local state is recent enough to act on, but not at once: peers
		// that are only slow to answer (a switch still booting after a
		// power cut) would leave this node the only live member of its
		// view, and it would start every replica of the cluster. It
		// waits as long as its peers wait before taking a lost node's
		// StatefulSet replicas (--failover-timeout), then runs with its
		// local state while joining goes on: a node must keep the
		// cluster's work running when every peer is gone.
		grace := time.AfterFunc(m.bootGrace, func() {
			if !m.IsSynced() && !nameTaken.Load() && !forgotten.Load() {
				m.log.Warn("no peer answered since start; acting on this node's local state alone until one does", "after", m.bootGrace)
				m.markSynced()
			}
		})
		defer grace.Stop()
	}
	for {
		n, err := joinSome(m.cluster.Join, targets)
		nameTaken.Store(errors.Is(err, gossip.ErrNameTaken))
		if errors.Is(err, gossip.ErrNameTaken) {
			// Another node runs under this name: this one must not
			// claim a subnet, publish a status or run replicas, so it
			// never counts as synced. It retries in case the other was
			// this node's own earlier run at another address, which
			// the cluster declares dead within seconds.
			m.log.Error("a live node already uses this name; not joining (start this agent with another --name, or stop the other node)", "err", err, "retryIn", backoff)
			if !wait() {
				return
			}
			continue
		}
		if n > 0 {
			m.log.Info("joined cluster", "contacted", n, "members", m.cluster.NumMembers())
			if m.droppedState {
				waitForState(ctx, changed, 30*time.Second)
			}
			m.askSettle(time.Now)
			m.markSynced()
			if returning {
				m.recheckSettle(ctx, time.Now().Add(m.settle), func() { m.askSettle(time.Now) })
			}
			return
		}
		if errors.Is(err, gossip.ErrKeyMismatch) && m.keys != nil {
			// The cluster rotated its key while this node was away.
			if changed, rerr := m.keys.Refresh(ctx, targets); changed {
				continue
			} else if api.IsRevoked(rerr) {
				if !forgotten.Swap(true) {
					m.forgotten(ctx)
				}
			} else if rerr != nil {
				m.log.Warn("could not take the current gossip keys from a seed", "err", rerr)
			}
		}
		m.log.Warn("join failed; retrying", "seeds", strings.Join(targets, ","), "err", err, "retryIn", backoff)
		if !wait() {
			return
		}
		targets = m.targets()
	}
}

func (m *members) markSynced() {
	m.syncOnce.Do(func() { close(m.synced) })
}

func (m *members) IsSynced() bool {
	select {
	case <-m.synced:
		return true
	default:
		return false
	}
}

// peersEvery is the least time between two writes of the live peers'
// list: in a forming cluster membership changes with every join, and the
// list of 1,000 addresses was written as often.
const peersEvery = 5 * time.Second

// watch keeps the list of live peers (for rejoining without seeds) and
// the last-seen time, on changes of the view (changed; the peers at most
// every peersEvery) and every minute, and purges expired tombstones every
// hour.
func (m *members) watch(ctx context.Context, changed func() <-chan struct{}) {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	purge := time.NewTicker(time.Hour)
	defer purge.Stop()
	var lastPeers string
	var from []gossip.Member // the membership lastPeers was made from
	var written time.Time
	later := time.NewTimer(0) // a write held back by peersEvery
	defer later.Stop()
	ch := changed()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-later.C:
		case <-tick.C:
			if m.IsSynced() {
				m.markSeen()
			}
		case <-purge.C:
			m.purgeTombstones()
		}
		ch = changed() // before the members are read
		ms := m.cluster.Members()
		if from != nil && gossip.SameSnapshot(from, ms) {
			continue // the same membership snapshot
		}
		if wait := peersEvery - time.Since(written); lastPeers != "" && wait > 0 {
			later.Reset(wait)
			continue
		}
		var peers []string
		for _, mem := range ms {
			if mem.Name != m.self && mem.State == gossip.StateAlive {
				peers = append(peers, net.JoinHostPort(mem.Addr, strconv.Itoa(int(mem.Port))))
			}
		}
		sort.Strings(peers)
		if b, _ := json.Marshal(peers); len(peers) > 0 && string(b) != lastPeers {
			if err := m.store.PutMeta(metaPeers, b); err != nil {
				continue // tried again on the next change or tick
			}
			lastPeers, written = string(b), time.Now()
		}
		from = ms
	}
}

// advertiseHost is the address peers know this node by.
func (m *members) advertiseHost(fallback string) string {
	if mem, ok := m.cluster.Member(m.self); ok {
		return mem.Addr
	}
	return fallback
}

// advertiseAddr is the gossip address ("ip:port") peers know this node
// by, or fallback (--advertise: "ip" or "ip:port") before membership
// lists it.
func (m *members) advertiseAddr(fallback string) string {
	if mem, ok := m.cluster.Member(m.self); ok {
		return net.JoinHostPort(mem.Addr, strconv.Itoa(int(mem.Port)))
	}
	return fallback
}

// purgeTombstones forgets deletes older than the tombstone TTL and tells
// gossip, whose digest index must match the store.
func (m *members) purgeTombstones() {
	n, err := m.store.Purge(time.Now(), m.ttl)
	if err != nil {
		m.log.Warn("purge tombstones", "err", err)
	}
	if n > 0 {
		if err := m.cluster.Reindex(); err != nil {
			m.log.Warn("reindex gossip state after purge", "err", err)
		}
		m.log.Info("purged expired tombstones", "count", n, "ttl", m.ttl)
	}
}
