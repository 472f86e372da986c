package node

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/quorum"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

// fence is this node's knowledge of whether it sees a majority of the
// known nodes (fencing), from the answers to its quorum questions
// (loop, quorum.Tracker), and the settling that follows a gap
// (selfBack). It owns its lock.
type fence struct {
	self            string
	fenceTimeout    time.Duration
	rejoinSettle    time.Duration
	failoverTimeout time.Duration
	drainDelay      time.Duration
	started         time.Time
	cluster         *gossip.Cluster
	members         *members
	log             *slog.Logger
	wake            *wake // the replicas' loop (a fencing change)

	pinged chan struct{} // closed after the first round of pings

	// questions counts the quorum questions this node sent.
	questions atomic.Int64

	mu sync.Mutex
	// has is the last quorum state noted; tracker holds the answers to
	// this node's questions (loop) and computes its counts (node/quorum);
	// skip rotates each depth's question past members that did not
	// answer; round is the members of the last round.
	has     bool
	tracker *quorum.Tracker
	skip    map[int]int
	round   []quorum.Member
	// from is the membership snapshot round was computed from; ids the
	// IDs of its members, by name; leaf and qs the round's plan (nil:
	// plan again).
	from []gossip.Member
	ids  map[string]quorum.ID
	leaf int
	qs   []quorum.Question
	// uncertified: the last round left out an up member that is not
	// certified (yet): roundAt is when, and the round is computed again
	// at most once a second until none is left out.
	uncertified bool
	roundAt     time.Time
	// certified reports whether a member is a node (memberAuth.certified;
	// nil: every member is).
	certified certifier
	// uncertifiedGauge is starling_uncertified_members (nil: none).
	uncertifiedGauge prometheus.Gauge
	// knownOf is the last count of known nodes, with its inputs.
	knownOf struct {
		v       *view.View
		members []gossip.Member
		n       int
	}
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

func newFence(cfg Config, started time.Time, cluster *gossip.Cluster, members *members, certified certifier, uncertified prometheus.Gauge,
	wake *wake, log *slog.Logger) *fence {
	self := quorum.Member{Name: cfg.Name, ID: quorum.IDOf(cfg.Name)}
	return &fence{self: cfg.Name, fenceTimeout: cfg.FenceTimeout, rejoinSettle: cfg.RejoinSettle, failoverTimeout: cfg.FailoverTimeout,
		drainDelay: cfg.DrainDelay, started: started, cluster: cluster, members: members, certified: certified, uncertifiedGauge: uncertified,
		wake: wake, log: log, pinged: make(chan struct{}),
		tracker: quorum.NewTracker(self, cfg.FenceTimeout, cfg.RejoinSettle), skip: map[int]int{}}
}

// fencing builds reconcile.Fence's input from this node's view.
//
// Quorum: the known nodes are this node and every node with a status
// record (a node is known until `starling node forget`; one that left
// still counts). A member with no record (a node still joining, a
// --dry-run agent, which publishes none, or a phantom: a name a holder
// of the gossip key made up, which memberlist takes unchecked) counts
// neither as known nor as seen (memberAuth.certified), so phantoms can
// neither dilute a majority nor make one. Seen are this node
// and the certified members memberlist reports alive that answered one of this
// node's quorum questions (loop: a round every 250 ms to 1 s, quorum.PeriodFor) within --fence-timeout;
// a member back from dead, or one that answered no ping for longer than
// --fence-timeout (memberlist may keep a cut-off member suspect for the
// whole cut), counts only after --rejoin-settle of answers, time in
// which this node takes the state the two sides wrote apart (the
// tracker's settling, quorum.NewTracker). So the minority side of a partition loses its
// majority --fence-timeout after the cut, whatever memberlist's failure
// detector (one probe per interval, slowed down by Lifeguard on an
// unhealthy node) makes of it, and well before the majority side has
// declared it dead and waited --failover-timeout.
//
// Occupied ordinals (of StatefulSets: reconcile.Fence reads no others):
// copies reported by a node memberlist calls alive or
// suspect, and those of a node down (dead or left) for less than
// --failover-timeout, counted from when this agent first saw it down (a
// member whose going down this agent has not recorded yet counts as down
// since now; a node memberlist does not know at all, since this agent
// started).
func (q *fence) fencing(v *view.View, observed []reconcile.Container, now time.Time) (reconcile.Fencing, int, int) {
	// Counted without building sets (a reconcile at 1,000 nodes built
	// three of them: 10 % of the CPU of the simulation): members is
	// sorted by name.
	members := q.cluster.Members()
	known := q.known(v, members)
	excluded := q.excluded()
	q.mu.Lock()
	defer q.mu.Unlock()
	seen := q.tracker.Seen(now, excluded)
	f := reconcile.Fencing{Quorum: reconcile.Majority(seen, known), Occupied: map[string]map[int]bool{}, Observed: observed}
	select {
	case <-q.pinged:
	default:
		f.Unknown = true // the first round of pings after joining has not run yet
	}
	q.checkLeaseLapse(now)
	if !q.selfBack.IsZero() && now.Sub(q.selfBack) < q.rejoinSettle {
		f.Unknown = true // back from being cut off: the view is not the majority's yet
	}
	// reconcile.Fence reads Occupied for StatefulSet replicas only.
	stateful := map[[2]string]bool{}
	for _, o := range v.Workloads {
		if o.StatefulSet != nil {
			stateful[[2]string{o.Namespace, o.Name}] = true
		}
	}
	for name, s := range v.Statuses {
		if len(stateful) == 0 {
			break
		}
		if name == q.self || len(s.Replicas) == 0 {
			continue
		}
		if st, member := view.MemberState(members, name); !st.Up() {
			since, ok := q.members.DownSince(name)
			switch {
			case ok:
			case member:
				since = now // went down after this view was read
			default:
				since = q.started
			}
			if now.Sub(since) >= q.failoverTimeout {
				continue
			}
		}
		for _, r := range s.Replicas {
			if !r.Phase.HasContainer() || !stateful[[2]string{r.Namespace, r.Workload}] {
				continue // no container, or not an at-most-one replica
			}
			key := reconcile.WorkloadKey(r.Namespace, r.Workload)
			if f.Occupied[key] == nil {
				f.Occupied[key] = map[int]bool{}
			}
			f.Occupied[key][r.Ordinal] = true
		}
	}
	return f, seen, known
}

// Majority reports whether this node counts a strict majority of the
// known nodes of v at now, as fencing does (false before its first round
// and while it settles after being cut off), and the last reconcile noted
// one too (what renews the lease, whose watchdog takes the addresses off
// when it lapses): the LoadBalancer announcer asks it before it
// announces.
func (q *fence) Majority(v *view.View, now time.Time) bool {
	known, excluded := q.known(v, q.cluster.Members()), q.excluded()
	q.mu.Lock()
	defer q.mu.Unlock()
	select {
	case <-q.pinged:
	default:
		return false
	}
	settling := !q.selfBack.IsZero() && now.Sub(q.selfBack) < q.rejoinSettle
	return q.has && !settling && reconcile.Majority(q.tracker.Seen(now, excluded), known)
}

// known is the number of known nodes (see fencing): v's statuses, this
// node, and live members without a status. It is counted once per view
// and membership snapshot.
func (q *fence) known(v *view.View, members []gossip.Member) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.knownOf.v == v && gossip.SameSnapshot(q.knownOf.members, members) {
		return q.knownOf.n
	}
	n := len(v.Statuses)
	if _, ok := v.Statuses[q.self]; !ok {
		n++
	}
	q.knownOf.v, q.knownOf.members, q.knownOf.n = v, members, n
	return n
}

// note records whether this node has a quorum (f, once known) and
// logs its changes.
func (q *fence) note(f reconcile.Fencing, seen, known int) {
	if f.Unknown {
		return
	}
	q.mu.Lock()
	changed := f.Quorum != q.has
	// A quorum regained after a partition needs no settling of its own:
	// the peers it sees again count only after --rejoin-settle
	// (quorum.Tracker), time in which this node takes their state.
	q.has = f.Quorum
	q.mu.Unlock()
	if changed && f.Quorum {
		q.log.Info("quorum: this node sees a majority; StatefulSet replicas may run here", "seen", seen, "known", known)
	} else if changed {
		q.log.Warn("quorum lost: this node sees no majority; killing its StatefulSet replicas", "seen", seen, "known", known)
	}
}

// excluded is the direct answers that do not count: from members
// memberlist does not call alive, or back from dead for less than
// --rejoin-settle (members.settling).
func (q *fence) excluded() func(string) bool {
	return func(name string) bool {
		st, ok := q.cluster.State(name)
		return !ok || st != gossip.StateAlive || q.members.Settling(name)
	}
}

// loop asks the questions of a round (quorum.Plan) every round period
// (quorum.PeriodFor: 1 s in a cluster of at most quorum.LeafSize nodes,
// which asks every member) and records the answers (see fencing); it
// asks for a reconcile when a source's answers start or stop counting.
// It starts once the node has joined and synced, and its first round
// decides whether the quorum is known.
func (q *fence) loop(ctx context.Context, synced <-chan struct{}) {
	select {
	case <-ctx.Done():
		return
	case <-synced:
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	fresh := map[string]bool{}
	last := time.Now()
	for first := true; ; first = false {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		start := time.Now()
		period := q.round1(first, &last)
		now := time.Now()
		changed := false
		q.mu.Lock()
		for src, f := range q.tracker.Fresh(now) {
			if f != fresh[src] {
				fresh[src], changed = f, true
			}
		}
		q.mu.Unlock()
		if first {
			close(q.pinged)
		}
		if changed || first {
			q.wake.kick()
		}
		timer.Reset(max(0, period-time.Since(start)))
	}
}

// round1 runs one round: it plans the questions, asks them all at once
// (each bounded by the round's period) and records the answers; it
// returns the round's period. last is when the previous round began.
func (q *fence) round1(first bool, last *time.Time) time.Duration {
	members := q.roundMembers(q.cluster.Members())
	q.mu.Lock()
	if q.qs == nil {
		// The plan changes only with the members and the skips.
		q.leaf, q.qs = quorum.Plan(q.tracker.Self, members, q.skip)
		q.tracker.SetLeaf(q.leaf, members)
	}
	leaf, qs := q.leaf, q.qs
	noQuorum := !q.has
	q.mu.Unlock()
	period := quorum.PeriodFor(leaf, q.fenceTimeout)
	if gap := time.Since(*last); !first && gap > q.fenceTimeout+period {
		// This loop did not run: the agent was stopped or starved, and
		// its peers may have started its StatefulSet replicas since.
		q.mu.Lock()
		q.noteBack(time.Now())
		q.mu.Unlock()
		q.log.Warn("this agent did not run for a while (stopped or starved): StatefulSet replicas start again only once the cluster's state is back (--rejoin-settle)", "gap", gap.Round(time.Millisecond))
	}
	*last = time.Now()
	var wg sync.WaitGroup
	for _, qu := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q.ask(qu, period, !first && noQuorum)
		}()
	}
	wg.Wait()
	return period
}

// ask asks one question and records its answer, or rotates the depth's
// question to another member when none came.
func (q *fence) ask(qu quorum.Question, timeout time.Duration, unheardIsSilence bool) {
	q.questions.Add(1)
	sent := time.Now()
	b, _, err := q.cluster.Ask(qu.To, []byte{byte(qu.Depth)}, timeout)
	var h quorum.Hist
	if err == nil {
		h, err = quorum.DecodeHist(b)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		if qu.Depth != quorum.Self {
			q.skip[qu.Depth]++
			q.qs = nil
		}
		return
	}
	// An answer counts at most the members this node knows in the
	// range it is about.
	if q.tracker.Answer(qu.Depth, qu.To, q.ids[qu.To], h.Cap(qu.Known), sent, time.Now(), unheardIsSilence) {
		time.AfterFunc(q.rejoinSettle+10*time.Millisecond, q.wake.kick)
	}
}

// answer answers another node's question (gossip.Config.Answer): this
// node's count of its range at the depth asked; nil for a malformed
// question.
func (q *fence) answer(from string, b []byte) []byte {
	if len(b) != 1 || (b[0] < 1 || b[0] > 64) && b[0] != quorum.Self {
		return nil
	}
	if b[0] == quorum.Self {
		return quorum.EncodeHist(quorum.One())
	}
	excluded := q.excluded()
	q.mu.Lock()
	h := q.tracker.Count(int(b[0]), time.Now(), excluded)
	q.mu.Unlock()
	return quorum.EncodeHist(h)
}

// statefulGrace bounds the grace period of a StatefulSet replica's stop:
// a stop that began before a partition must still end before the majority
// side starts a replacement, which is at least --failover-timeout after
// failure detection. It leaves --fence-timeout, --drain-delay and 2 s of
// margin out of --failover-timeout.
func (q *fence) statefulGrace() time.Duration {
	return max(0, q.failoverTimeout-q.fenceTimeout-q.drainDelay-2*time.Second)
}

// noteBack records that this node came back to the cluster at now (see
// selfBack) and asks for a reconcile when the settling ends, so what
// waited for it starts then. Called with q.mu held.
func (q *fence) noteBack(now time.Time) {
	q.selfBack = now
	time.AfterFunc(q.rejoinSettle+10*time.Millisecond, q.wake.kick)
}
