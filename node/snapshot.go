package node

import (
	"context"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/starling-orchestrator/starling/gossip"
)

// The one view. One goroutine (viewLoop) rebuilds the node's view of the
// cluster, an immutable snapshot, when the store or membership changes
// (debounced by viewDebounce, at most one rebuild per viewGap) and when
// what depends on time alone changes
// (flap damping, exclusions: checked every viewTick). Every loop and every
// API read takes the latest snapshot (Agent.view); nothing else reads the
// desired state for a decision or calls placement. A rebuild decodes only
// the records that changed since the last one, and runs placement only
// when its inputs changed (live eligible nodes, workloads, exclusions):
// status records, which change with every replica, do not move anything.

const (
	// viewDebounce gathers a burst of gossip (a push/pull, an apply of
	// many objects) into one rebuild.
	viewDebounce = 20 * time.Millisecond
	// viewGap is the least time between two rebuilds by the view loop
	// (an API write rebuilds at once, to read its write). A rebuild and the
	// loops it wakes cost O(nodes + replicas); without a gap, a cluster
	// whose N nodes each publish a few status records as a workload
	// moves has every node rebuild for each of them: O(N^2 (N + R))
	// across the cluster. At 300 simulated nodes the view and the loops
	// it woke took 60 % of the CPU while 3,000 replicas were placed.
	viewGap = 200 * time.Millisecond
	// viewTick is how often the inputs that change with time alone are
	// looked at (a rebuild follows only when they changed).
	viewTick = time.Second
)

// views holds the current snapshot, wakes those waiting for the next, and
// builds them from what it reads: the store, membership (members: flap
// damping) and the nodes left out of placement (acks).
type views struct {
	self        string
	store       Store
	cluster     *gossip.Cluster
	members     *members
	acks        *ackTracker
	serviceCIDR *net.IPNet
	clusterCIDR netip.Prefix
	placements  prometheus.Counter
	builds      prometheus.Counter // snapshots built
	log         *slog.Logger
	// selfStatus is this node's record before it published one;
	// started is when this run of the agent started (a held record of
	// this node from before it is of an earlier run: view.oldSelf).
	selfStatus func() NodeStatus
	started    time.Time
	// reclaimAfter is --subnet-reclaim-after: how long a down node's
	// subnet claim still counts after its last record (reclaimedWinners).
	reclaimAfter time.Duration
	// share is what agents of one process decode once for all (nil
	// but in the scale simulation: decodeshare.go).
	share *decodeShare

	cur  atomic.Pointer[view]
	mu   sync.Mutex
	next chan struct{} // closed when a newer snapshot is stored

	// Owned by the builder (viewLoop, or the first build before it
	// runs; build serialises them).
	build sync.Mutex
	// objects and statuses cache decoded records by key: a record is
	// decoded again only when its version changed. held is the valid
	// statuses by node name, kept up to date from the store's changed
	// keys (sync); heldGen and objGen count the changes to held and to
	// the desired objects' records.
	objects         map[string]cachedObject
	statuses        map[string]cachedStatus
	held            map[string]NodeStatus
	heldGen, objGen uint64
	// claimsGen and nodesGen count the changes to the held statuses'
	// subnet claims, and to what placement reads of a node (claim,
	// readiness, capacity, labels): a status that lists other replicas
	// changes neither, and what is computed from them is kept.
	claimsGen, nodesGen uint64
	// claims indexes held's subnet claims and their winners.
	claims *claimIndex

	// endpoints indexes the ready endpoints of the views derived;
	// svcChanges gathers the Services whose ports changed, for the
	// services loop (serviceview.go).
	endpoints  endpointIndex
	svcChanges serviceChanges
	// away indexes the copies the nodes run away from placement's
	// choice (held.go); placementGen counts the placements computed.
	away         heldIndex
	placementGen uint64
}

func newViews() *views {
	return &views{next: make(chan struct{}), objects: map[string]cachedObject{}, statuses: map[string]cachedStatus{}, held: map[string]NodeStatus{},
		claims: newClaimIndex(), reclaimAfter: DefaultConfig().SubnetReclaimAfter}
}

// load returns the current snapshot (nil before the first build).
func (vs *views) load() *view { return vs.cur.Load() }

// changed returns a channel that is closed when a snapshot newer than
// the current one is stored.
func (vs *views) changed() <-chan struct{} {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	return vs.next
}

func (vs *views) set(v *view) {
	vs.cur.Store(v)
	vs.mu.Lock()
	// The view's changed Services are noted once it is the current
	// one, before anyone is woken (serviceChanges).
	if v.svcAll {
		vs.svcChanges.noteAll()
	}
	vs.svcChanges.note(v.svcChanged)
	close(vs.next)
	vs.next = make(chan struct{})
	vs.mu.Unlock()
}

// view returns the latest snapshot of the cluster, building the first one
// if none was built yet. It takes no lock but the builder's, once.
func (vs *views) view() *view {
	if v := vs.load(); v != nil {
		return v
	}
	vs.rebuild(time.Now())
	return vs.load()
}

// viewLoop rebuilds the snapshot on store and membership changes and when
// its time-dependent inputs change; it is the only reader of the store's
// and the cluster's change channels.
func (vs *views) loop(ctx context.Context) {
	tick := time.NewTicker(viewTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-vs.store.Changed():
		case <-vs.cluster.Changed():
		case <-tick.C:
			if v := vs.load(); v != nil && !vs.timeInputsChanged(v, time.Now()) {
				continue
			}
		}
		// Debounce: the rest of a burst lands in this rebuild; under a
		// stream of changes (every node's status records while a
		// workload moves), rebuilds come at most every viewGap.
		wait := viewDebounce
		if v := vs.load(); v != nil && time.Since(v.built) < viewGap {
			wait = max(wait, viewGap-time.Since(v.built))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		vs.rebuild(time.Now())
	}
}

// timeInputsChanged reports whether the members that count as alive or
// the nodes left out of placement differ, at now, from v's, a node has
// gone unlisted for --ack-timeout (the build would exclude it), or a
// subnet reservation that beat a claim has expired (v.reclaimAt).
func (vs *views) timeInputsChanged(v *view, now time.Time) bool {
	if !v.reclaimAt.IsZero() && !now.Before(v.reclaimAt) {
		return true
	}
	if vs.acks.due(now) {
		return true
	}
	if _, same := vs.members.aliveAfter(now, vs.cluster.Members(), &v.aliveFrom); !same {
		return true
	}
	ex := vs.acks.excluded(now)
	if len(ex) != len(v.excluded) {
		return true
	}
	for n := range ex {
		if !v.excluded[n] {
			return true
		}
	}
	return false
}

// rebuildView builds a snapshot from the store and membership at now and
// stores it; on a store error it logs and keeps the previous one.
func (vs *views) rebuild(now time.Time) {
	vs.build.Lock()
	defer vs.build.Unlock()
	v, err := vs.buildAt(vs.load(), now)
	if err != nil {
		vs.log.Error("read the cluster state for the view", "err", err)
		return
	}
	vs.set(v)
	if vs.builds != nil {
		vs.builds.Inc()
	}
}

// buildView computes the snapshot after prev (nil for the first one).
func (vs *views) buildAt(prev *view, now time.Time) (*view, error) {
	// Read before the store and membership: a view marked synced holds
	// at least the membership the sync's join brought (records announced
	// in its digests may still be arriving).
	v := &view{built: now, synced: vs.members.isSynced()}
	if err := vs.sync(); err != nil {
		return nil, err
	}
	v.objGen, v.heldGen, v.claimsGen, v.nodesGen = vs.objGen, vs.heldGen, vs.claimsGen, vs.nodesGen
	if err := vs.objectsInto(v, prev); err != nil {
		return nil, err
	}
	// The statuses are shared with the previous view when no status
	// record changed (and this node's own is held: until it is, the view
	// shows what it would publish now).
	_, selfHeld := vs.held[vs.self]
	sameStatuses := prev != nil && prev.heldGen == v.heldGen && selfHeld
	if sameStatuses {
		v.statuses = prev.statuses
	} else {
		v.statuses = maps.Clone(vs.held)
		if !selfHeld && vs.selfStatus != nil {
			v.statuses[vs.self] = vs.selfStatus()
		}
	}
	v.members = vs.cluster.Members()
	var prevAlive *aliveSnap
	if prev != nil {
		prevAlive = &prev.aliveFrom
	}
	v.aliveFrom, _ = vs.members.aliveAfter(now, v.members, prevAlive)
	v.alive = v.aliveFrom.set
	v.stale = staleRecords(v.members, v.alive, v.statuses, vs.self)
	if s, ok := v.statuses[vs.self]; ok && earlierRun(s, vs.started) {
		v.oldSelf = vs.self
	}
	v.excluded = vs.acks.excluded(now)
	if sameStatuses && prev.objGen == v.objGen && maps.Equal(prev.alive, v.alive) && maps.Equal(prev.stale, v.stale) && maps.Equal(prev.excluded, v.excluded) &&
		(prev.reclaimAt.IsZero() || now.Before(prev.reclaimAt)) {
		// Nothing the rest is computed from changed (a membership event
		// that moved no one, a record of another kind), and no
		// reservation that beat a subnet claim expired.
		v.reclaimAt = prev.reclaimAt
		v.claimWinners = prev.claimWinners
		v.winners, v.eligible, v.nodesKey, v.placementKey, v.placement, v.owner = prev.winners, prev.eligible, prev.nodesKey, prev.placementKey, prev.placement, prev.owner
		v.plain, v.plainWithout, v.held = prev.plain, prev.plainWithout, prev.held
		v.given, v.own = prev.given, prev.own
		v.svcPorts, v.unlisted = prev.svcPorts, prev.unlisted
	} else {
		vs.derive(v, prev, selfHeld)
	}
	for _, x := range vs.acks.observe(now, v.unlisted, (len(v.eligible)-1)/2) {
		vs.log.Warn("a node does not list the replicas placed on it (it says it is ready but does not run them); placing nothing on it for a while",
			"node", oneLine(x.node), "unlistedFor", vs.acks.timeout, "excludedFor", x.for_)
	}
	return v, nil
}

// derive computes what v holds from its statuses, workloads and
// members: the winning subnet claims and the eligible nodes (kept from
// prev when the claims, the nodes' placement fields and the live members
// did not change, and gens says the statuses' change counts hold: this
// node's own record is held), placement (only when its own inputs
// differ from prev's), the Services' ports and the nodes that do not
// list the replicas placed on them.
func (vs *views) derive(v, prev *view, gens bool) {
	sameClaims := gens && prev != nil && prev.claimsGen == v.claimsGen
	switch {
	case sameClaims:
		v.claimWinners = prev.claimWinners
	case gens:
		v.claimWinners = maps.Clone(vs.claims.winners)
	default:
		v.claimWinners = winningClaims(v.statuses) // with this node's unpublished record
	}
	// From the claims' winners each time, never from prev.winners: a node
	// that took a dead node's subnet stops winning when that node is back.
	v.winners = vs.reclaimedWinners(v)
	if sameClaims && prev.nodesGen == v.nodesGen && maps.Equal(prev.alive, v.alive) && maps.Equal(prev.winners, v.winners) {
		v.eligible, v.nodesKey = prev.eligible, prev.nodesKey
	} else {
		v.eligible = eligibleNodes(v.alive, v.statuses, v.winners)
		v.nodesKey = nodesKey(v.eligible)
	}
	// Placement's own inputs, not the records': an annotation or an
	// image change of a workload moves nothing.
	v.placementKey = v.workloadsKey + "|" + v.nodesKey + "|" + setKey(v.excluded)
	sameInputs := prev != nil && prev.placementKey == v.placementKey
	if sameInputs {
		v.plain, v.plainWithout = prev.plain, prev.plainWithout
	} else {
		v.plain, v.plainWithout = assign(v.eligible, v.workloads, v.excluded)
		vs.placements.Inc()
		vs.placementGen++
	}
	// What the nodes run away from placement's choice stays there
	// (placement.Keep): the records that changed are read on each derive.
	v.held = vs.away.elsewhere(vs.placementGen, v.plain, v.plainWithout, v.eligible, v.statuses, v.stale)
	if sameInputs && sameHolders(prev.held, v.held) {
		v.placement, v.owner, v.given, v.own = prev.placement, prev.owner, prev.given, prev.own
		if prev.objectsKey != v.objectsKey {
			// Same placement, other objects (an annotation): this
			// node's replicas are the new expansions.
			v.own = ownedBy(vs.self, v.all, v.owner)
		}
	} else {
		v.placement, v.owner = place(v.plain, v.plainWithout, v.eligible, v.workloads, v.all, v.excluded, v.held)
		v.given, v.own = givenSlots(v.all, v.placement), ownedBy(vs.self, v.all, v.owner)
	}
	vs.servicesInto(v, prev)
	// Nodes are judged on what placement gives them before anyone is
	// left out: a node that runs what it was given is never blamed for
	// replicas this node's exclusions moved to it (and others did not).
	// A node does not judge itself, and leaves at most a minority out.
	v.unlisted = unreported(v.given, v.statuses)
	delete(v.unlisted, vs.self)
	if vs.acks.timeout <= 0 {
		v.unlisted = nil // the check is off (--ack-timeout 0)
	}
}
