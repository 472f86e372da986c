package node

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// quorum is this node's knowledge of whether it sees a majority of the
// known nodes (fencing), from its own pings, and the settling that follows
// a gap (selfBack). It owns its lock.
type quorum struct {
	self            string
	fenceTimeout    time.Duration
	rejoinSettle    time.Duration
	failoverTimeout time.Duration
	drainDelay      time.Duration
	started         time.Time
	cluster         *gossip.Cluster
	members         *members
	log             *slog.Logger
	kick            func()

	pinged chan struct{} // closed after the first round of pings

	mu sync.Mutex
	// has is the last quorum state noted; acks are the peers' answers
	// to the pings (loop).
	has  bool
	acks peerAcks
	// selfBack is when this node came back to the cluster after its
	// agent did not run for longer than --fence-timeout (stopped,
	// starved: the ping loop saw the gap, or its fence lease ran out
	// while a renewal was due). For --rejoin-settle after it, its view
	// of who runs which StatefulSet replica is stale, so it starts none
	// (quorum Unknown: what runs is kept).
	selfBack time.Time
	// leaseDeadline is the deadline of the last fence lease written
	// (watchdog.go); zero when none is pending.
	leaseDeadline time.Time
}

func newQuorum(cfg Config, started time.Time, log *slog.Logger) *quorum {
	return &quorum{self: cfg.Name, fenceTimeout: cfg.FenceTimeout, rejoinSettle: cfg.RejoinSettle, failoverTimeout: cfg.FailoverTimeout,
		drainDelay: cfg.DrainDelay, started: started, log: log, pinged: make(chan struct{}), acks: newPeerAcks()}
}

// fencing builds reconcile.Fence's input from this node's view.
//
// Quorum: the known nodes are every node with a status record (a node is
// known until `starling node forget`; one that left cleanly still counts)
// and every live member (a node still joining; a --dry-run agent, which
// publishes no record, counts only while it is up). Seen are this node
// and the members memberlist reports alive that answered one of this
// node's direct pings (quorumLoop, once a second) within --fence-timeout;
// a member back from dead, or one that answered no ping for longer than
// --fence-timeout (memberlist may keep a cut-off member suspect for the
// whole cut), counts only after --rejoin-settle of answers, time in
// which this node takes the state the two sides wrote apart (peerAcks). So the minority side of a partition loses its
// majority --fence-timeout after the cut, whatever memberlist's failure
// detector (one probe per interval, slowed down by Lifeguard on an
// unhealthy node) makes of it, and well before the majority side has
// declared it dead and waited --failover-timeout.
//
// Held ordinals: copies reported by a node memberlist calls alive or
// suspect, and those of a node down (dead or left) for less than
// --failover-timeout, counted from when this agent first saw it down (a
// member whose going down this agent has not recorded yet counts as down
// since now; a node memberlist does not know at all, since this agent
// started).
func (q *quorum) fencing(v *view, observed []reconcile.Container, now time.Time) (reconcile.Fencing, int, int) {
	known := map[string]bool{q.self: true}
	for name := range v.statuses {
		known[name] = true
	}
	up, member := map[string]bool{}, map[string]bool{}
	seen := 1
	members := q.cluster.Members()
	settling := map[string]bool{}
	for _, m := range members {
		settling[m.Name] = q.members.settling(m.Name)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, m := range members {
		if m.Name == q.self {
			continue
		}
		member[m.Name] = true
		if m.State.Up() {
			up[m.Name] = true
			known[m.Name] = true
		}
		if m.State == gossip.StateAlive && !settling[m.Name] && q.acks.counts(m.Name, now, q.fenceTimeout, q.rejoinSettle) {
			seen++
		}
	}
	f := reconcile.Fencing{Quorum: reconcile.Majority(seen, len(known)), Held: map[string]map[int]bool{}, Observed: observed}
	select {
	case <-q.pinged:
	default:
		f.Unknown = true // the first round of pings after joining has not run yet
	}
	q.checkLeaseLapse(now)
	if !q.selfBack.IsZero() && now.Sub(q.selfBack) < q.rejoinSettle {
		f.Unknown = true // back from being cut off: the view is not the majority's yet
	}
	for name, s := range v.statuses {
		if name == q.self {
			continue
		}
		if !up[name] {
			since, ok := q.members.downSince(name)
			switch {
			case ok:
			case member[name]:
				since = now // went down after this view was read
			default:
				since = q.started
			}
			if now.Sub(since) >= q.failoverTimeout {
				continue
			}
		}
		for _, r := range s.Replicas {
			if r.Phase == api.PhasePending || r.Phase == api.PhaseCreateBackOff {
				continue // no container
			}
			key := reconcile.WorkloadKey(r.Namespace, r.Workload)
			if f.Held[key] == nil {
				f.Held[key] = map[int]bool{}
			}
			f.Held[key][r.Ordinal] = true
		}
	}
	return f, seen, len(known)
}

// noteQuorum records whether this node has a quorum (f, once known) and
// logs its changes.
func (q *quorum) note(f reconcile.Fencing, seen, known int) {
	if f.Unknown {
		return
	}
	q.mu.Lock()
	changed := f.Quorum != q.has
	// A quorum regained after a partition needs no settling of its own:
	// the peers it sees again count only after --rejoin-settle
	// (memberBack, peerAcks), time in which this node takes their state.
	q.has = f.Quorum
	q.mu.Unlock()
	if changed && f.Quorum {
		q.log.Info("quorum: this node sees a majority; StatefulSet replicas may run here", "seen", seen, "known", known)
	} else if changed {
		q.log.Warn("quorum lost: this node sees no majority; killing its StatefulSet replicas", "seen", seen, "known", known)
	}
}

// loop pings every live member once a second and records the acks
// (see fencing); it asks for a reconcile when a member's answers start or
// stop counting. It starts once the node has joined and synced, and its
// first round decides whether the quorum is known.
func (q *quorum) loop(ctx context.Context, synced <-chan struct{}) {
	select {
	case <-ctx.Done():
		return
	case <-synced:
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	fresh := map[string]bool{}
	last := time.Now()
	for first := true; ; first = false {
		if gap := time.Since(last); gap > q.fenceTimeout+time.Second {
			// This loop did not run: the agent was stopped or starved, and
			// its peers may have started its StatefulSet replicas since.
			q.mu.Lock()
			q.noteBack(time.Now())
			q.mu.Unlock()
			q.log.Warn("this agent did not run for a while (stopped or starved): StatefulSet replicas start again only once the cluster's state is back (--rejoin-settle)", "gap", gap.Round(time.Millisecond))
		}
		last = time.Now()
		var wg sync.WaitGroup
		for _, m := range q.cluster.Members() {
			if m.Name == q.self || !m.State.Up() {
				continue
			}
			wg.Add(1)
			go func(name string) {
				defer wg.Done()
				if _, err := q.cluster.Ping(name); err == nil {
					q.mu.Lock()
					// A member first heard of while this node has no
					// quorum may be the majority it was cut off from
					// (an agent restarted inside a partition).
					if q.acks.ack(name, time.Now(), q.fenceTimeout, !first && !q.has) {
						time.AfterFunc(q.rejoinSettle+10*time.Millisecond, q.kick)
					}
					q.mu.Unlock()
				}
			}(m.Name)
		}
		wg.Wait()
		if first {
			close(q.pinged)
		}
		now := time.Now()
		changed := false
		q.mu.Lock()
		for name, at := range q.acks.last {
			if f := now.Sub(at) < q.fenceTimeout; f != fresh[name] {
				fresh[name], changed = f, true
			}
		}
		q.mu.Unlock()
		if changed || first {
			q.kick()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// peerAcks are the answers of peers to this node's quorum pings. A peer
// that did not answer for longer than the fence timeout was cut off from
// this node (or this node from it): what either side wrote meanwhile has
// not reached the other, so it counts again only once it has answered
// for the settle time (--rejoin-settle), as a member back from dead does.
// Not safe for concurrent use (quorum's mu guards it).
type peerAcks struct {
	last map[string]time.Time // last answer
	back map[string]time.Time // when answers resumed after a silence
}

func newPeerAcks() peerAcks {
	return peerAcks{last: map[string]time.Time{}, back: map[string]time.Time{}}
}

// ack records an answer of name at now and reports whether it ends a
// silence longer than timeout; an answer from a peer never heard before
// ends one when unheardIsSilence is set.
func (p *peerAcks) ack(name string, now time.Time, timeout time.Duration, unheardIsSilence bool) bool {
	prev, ok := p.last[name]
	p.last[name] = now
	if ok && now.Sub(prev) > timeout || !ok && unheardIsSilence {
		p.back[name] = now
		return true
	}
	return false
}

// counts reports whether name counts as seen at now: it answered within
// timeout and, if its answers resumed after a silence, has answered for
// settle since.
func (p *peerAcks) counts(name string, now time.Time, timeout, settle time.Duration) bool {
	if now.Sub(p.last[name]) >= timeout {
		return false
	}
	if back, ok := p.back[name]; ok {
		if now.Sub(back) < settle {
			return false
		}
		delete(p.back, name)
	}
	return true
}

// statefulGrace bounds the grace period of a StatefulSet replica's stop:
// a stop that began before a partition must still end before the majority
// side starts a replacement, which is at least --failover-timeout after
// failure detection. It leaves --fence-timeout, --drain-delay and 2 s of
// margin out of --failover-timeout.
func (q *quorum) statefulGrace() time.Duration {
	return max(0, q.failoverTimeout-q.fenceTimeout-q.drainDelay-2*time.Second)
}

// noteBack records that this node came back to the cluster at now (see
// selfBack) and asks for a reconcile when the settling ends, so what
// waited for it starts then. Called with q.mu held.
func (q *quorum) noteBack(now time.Time) {
	q.selfBack = now
	time.AfterFunc(q.rejoinSettle+10*time.Millisecond, q.kick)
}

// forLease is what a lease renewal at now needs: whether this node holds
// the quorum (after looking for a lapsed lease, checkLeaseLapse).
func (q *quorum) forLease(now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.checkLeaseLapse(now)
	return q.has
}

// leased records the deadline of the lease just written.
func (q *quorum) leased(deadline time.Time) {
	q.mu.Lock()
	q.leaseDeadline = deadline
	q.mu.Unlock()
}

// checkLeaseLapse notes this node as back (noteBack) when its last fence
// lease ran out while it held the quorum (so a renewal was due): the agent was stopped or starved
// that long, its watchdog may have killed its StatefulSet replicas and
// its peers may have started them. Whoever looks first after such a gap
// (a reconcile, or the renewal) sees it, before anything is started on a
// view from before the gap. Called with q.mu held.
func (q *quorum) checkLeaseLapse(now time.Time) {
	if !q.leaseDeadline.IsZero() && now.After(q.leaseDeadline) {
		q.leaseDeadline = time.Time{}
		if !q.has {
			return // fenced: no renewal was due; regaining the quorum settles
		}
		q.noteBack(now)
		q.log.Warn("this node's fence lease ran out before it was renewed (the agent was stopped or starved): StatefulSet replicas start again only after --rejoin-settle")
	}
}
