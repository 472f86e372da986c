package view

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
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
)

// The one view. One goroutine (Builder.loop) rebuilds the node's view of the
// cluster, an immutable snapshot, when the store or membership changes
// (debounced by viewDebounce, at most one rebuild per viewGap) and when
// what depends on time alone changes
// (flap damping, exclusions: checked every viewTick). Every loop and every
// API read takes the latest snapshot (Builder.View); nothing else reads the
// desired state for a decision or calls placement. A rebuild decodes only
// the records that changed since the last one, and runs placement only
// when its inputs changed (live eligible nodes, workloads, exclusions):
// status records, which change with every replica, do not move anything.

const (
	// viewDebounce gathers a burst of gossip (a push/pull, an apply of
	// many objects) into one rebuild.
	viewDebounce = 20 * time.Millisecond
	// ViewGap is the least time between two rebuilds by the view loop
	// (an API write rebuilds at once, to read its write). A rebuild and the
	// loops it wakes cost O(nodes + replicas); without a gap, a cluster
	// whose N nodes each publish a few status records as a workload
	// moves has every node rebuild for each of them: O(N^2 (N + R))
	// across the cluster. At 300 simulated nodes the view and the loops
	// it woke took 60 % of the CPU while 3,000 replicas were placed.
	ViewGap = 200 * time.Millisecond
	// viewTick is how often the inputs that change with time alone are
	// looked at (a rebuild follows only when they changed).
	viewTick = time.Second
)

// Records is what a Builder reads of the store: records by key and
// prefix, a signal after writes, and which keys those writes changed.
// Node's change-tracking store (node/storage.go) is one.
type Records interface {
	Get(key string) (crdt.Record, bool, error)
	List(prefix string) ([]crdt.Record, error)
	// Changed receives a value after writes that changed records.
	Changed() <-chan struct{}
	// Take returns the keys changed since the last Take; all is true
	// when any record may have changed (a purge, a drop, the first
	// call), and the keys are then not listed.
	Take() (keys []string, all bool)
	// SetAll makes the next Take answer all (a read that failed).
	SetAll()
}

// Membership is what a Builder reads of membership: the members as
// gossip gives them, sorted by name, and a signal when they change
// (gossip.Cluster).
type Membership interface {
	Members() []gossip.Member
	Changed() <-chan struct{}
}

// Damping is the node's judgment of its membership (node's members):
// which members count as alive for placement (flap damping, Alive),
// and whether the node holds the cluster's state.
type Damping interface {
	AliveAfter(now time.Time, list []gossip.Member, prev *Alive) (Alive, bool)
	IsSynced() bool
}

// Unpublished gives the record this node would publish now (its status
// part).
type Unpublished interface {
	Unpublished() NodeStatus
}

// Config is what a Builder is made of; every field but the counters,
// SelfStatus and Share is required.
type Config struct {
	// Self is this node's name.
	Self       string
	Records    Records
	Membership Membership
	Damping    Damping
	// Acks judges the nodes that do not list the replicas placed on
	// them (unresponsive.go).
	Acks        *AckTracker
	ServiceCIDR *net.IPNet
	ClusterCIDR netip.Prefix
	// Placements counts placements computed, Builds the snapshots built
	// (nil: not counted).
	Placements, Builds prometheus.Counter
	Log                *slog.Logger
	// SelfStatus gives this node's record before it published one
	// (nil: none); Started is when this run of the agent started (a
	// held record of this node from before it is of an earlier run:
	// View.OldSelf).
	SelfStatus Unpublished
	Started    time.Time
	// RejoinSettle is --rejoin-settle: the longest a node's record may
	// leave it out of placement (SettlingOut).
	RejoinSettle time.Duration
	// ReclaimAfter is --subnet-reclaim-after: how long a down node's
	// subnet claim still counts after its last record (reclaimedWinners).
	ReclaimAfter time.Duration
	// Checked holds the statuses decoded when their records were checked
	// on arrival (nil: none), so the view does not decode them again.
	Checked *Checked
	// Claims receives the claims of each view built (nil: none).
	Claims *ClaimsFeed
	// Share is what agents of one process decode once for all (nil but
	// in the scale simulation: decodeshare.go).
	Share *DecodeShare
	// Opener opens Secret records (nil: none is sealed).
	Opener Opener
}

// Builder holds the current snapshot, wakes those waiting for the next,
// and builds them from what it reads (Config): the records, membership
// with its flap damping, and the nodes left out of placement.
type Builder struct {
	cfg Config

	cur  atomic.Pointer[View]
	mu   sync.Mutex
	next chan struct{} // closed when a newer snapshot is stored

	// Owned by the builder (Builder.loop, or the first build before it
	// runs; build serialises them).
	build sync.Mutex
	// objects and statuses cache decoded records by key: a record is
	// decoded again only when its version changed. held is the valid
	// statuses by node name, kept up to date from the store's changed
	// keys (sync); pending is what changed since the last view built
	// (a build that fails keeps it for the next), last that view.
	objects map[string]cachedObject
	// badConfig is the version of each ConfigMap or Secret record that
	// did not decode, last logged (configInto), configRetry when they
	// are tried again.
	badConfig   map[string]string
	configRetry time.Time
	statuses    map[string]cachedStatus
	held        map[string]NodeStatus
	pending     Changes
	last        *View
	// claims indexes held's subnet claims and their winners.
	claims *claimIndex

	// endpoints indexes the ready endpoints of the views derived;
	// svcChanges gathers the Services whose ports changed, for the
	// services loop (serviceview.go).
	endpoints  EndpointIndex
	svcChanges serviceChanges
	// away indexes the copies the nodes run away from placement's
	// choice (away.go).
	away AwayIndex
}

// NewBuilder returns a Builder of views from c; the first view is built
// by the first Rebuild or View.
func NewBuilder(c Config) *Builder {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return &Builder{cfg: c, next: make(chan struct{}), objects: map[string]cachedObject{}, badConfig: map[string]string{}, statuses: map[string]cachedStatus{}, held: map[string]NodeStatus{},
		claims: newClaimIndex()}
}

// Load returns the current snapshot (nil before the first build).
func (vs *Builder) Load() *View { return vs.cur.Load() }

// Changed returns a channel that is closed when a snapshot newer than
// the current one is stored.
func (vs *Builder) Changed() <-chan struct{} {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	return vs.next
}

func (vs *Builder) Set(v *View) {
	vs.cur.Store(v)
	vs.mu.Lock()
	// The view's changed Services are noted once it is the current
	// one, before anyone is woken (serviceChanges).
	if v.svcAll {
		vs.svcChanges.noteAll()
	}
	vs.svcChanges.note(v.SvcChanged)
	close(vs.next)
	vs.next = make(chan struct{})
	vs.mu.Unlock()
}

// View returns the latest snapshot of the cluster, building the first one
// if none was built yet. It takes no lock but the builder's, once.
func (vs *Builder) View() *View {
	if v := vs.Load(); v != nil {
		return v
	}
	vs.Rebuild(time.Now())
	return vs.Load()
}

// Loop rebuilds the snapshot on store and membership changes and when
// its time-dependent inputs change; it is the only reader of the store's
// and the cluster's change channels.
func (vs *Builder) Loop(ctx context.Context) {
	tick := time.NewTicker(viewTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-vs.cfg.Records.Changed():
		case <-vs.cfg.Membership.Changed():
		case <-tick.C:
			if v := vs.Load(); v != nil && !vs.timeInputsChanged(v, time.Now()) {
				continue
			}
		}
		// Debounce: the rest of a burst lands in this rebuild; under a
		// stream of changes (every node's status records while a
		// workload moves), rebuilds come at most every viewGap.
		wait := viewDebounce
		if v := vs.Load(); v != nil && time.Since(v.built) < ViewGap {
			wait = max(wait, ViewGap-time.Since(v.built))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		vs.Rebuild(time.Now())
	}
}

// timeInputsChanged reports whether the members that count as alive or
// the nodes left out of placement differ, at now, from v's, a node has
// gone unlisted for --ack-timeout (the build would exclude it), a
// subnet reservation that beat a claim has expired (v.reclaimAt), or a
// node that left itself out of placement counts again (v.settleAt).
func (vs *Builder) timeInputsChanged(v *View, now time.Time) bool {
	if !v.reclaimAt.IsZero() && !now.Before(v.reclaimAt) || !v.settleAt.IsZero() && !now.Before(v.settleAt) {
		return true
	}
	if vs.cfg.Acks.due(now) {
		return true
	}
	if _, same := vs.cfg.Damping.AliveAfter(now, vs.cfg.Membership.Members(), &v.aliveFrom); !same {
		return true
	}
	ex := vs.cfg.Acks.excluded(now)
	if len(ex) != len(v.Excluded) {
		return true
	}
	for n := range ex {
		if !v.Excluded[n] {
			return true
		}
	}
	return false
}

// Rebuild builds a snapshot from the store and membership at now and
// stores it; on a store error it logs and keeps the previous one.
func (vs *Builder) Rebuild(now time.Time) {
	vs.build.Lock()
	defer vs.build.Unlock()
	v, err := vs.buildAt(vs.Load(), now)
	if err != nil {
		vs.cfg.Log.Error("read the cluster state for the view", "err", err)
		return
	}
	vs.Set(v)
	vs.last, vs.pending = v, Changes{}
	vs.cfg.Claims.Store(v.claims)
	if vs.cfg.Builds != nil {
		vs.cfg.Builds.Inc()
	}
}

// buildAt computes the snapshot after prev (nil for the first one).
func (vs *Builder) buildAt(prev *View, now time.Time) (*View, error) {
	// Read before the store and membership: a view marked synced holds
	// at least the membership the sync's join brought (records announced
	// in its digests may still be arriving).
	v := &View{built: now, Synced: vs.cfg.Damping.IsSynced()}
	if err := vs.sync(); err != nil {
		return nil, err
	}
	v.Changes = vs.pending
	if prev == nil || prev != vs.last {
		v.Changes = everything // no view, or one this builder did not build
	}
	if err := vs.objectsInto(v, prev); err != nil {
		return nil, err
	}
	if err := vs.configInto(v, prev); err != nil {
		return nil, err
	}
	if err := vs.ingressesInto(v, prev); err != nil {
		return nil, err
	}
	// The statuses are shared with the previous view when no status
	// record changed (and this node's own is held: until it is, the view
	// shows what it would publish now).
	_, selfHeld := vs.held[vs.cfg.Self]
	sameStatuses := !v.Changes.Statuses && selfHeld
	if sameStatuses {
		v.Statuses = prev.Statuses
	} else {
		v.Statuses = maps.Clone(vs.held)
		if !selfHeld && vs.cfg.SelfStatus != nil {
			v.Statuses[vs.cfg.Self] = vs.cfg.SelfStatus.Unpublished()
		}
	}
	v.Members = vs.cfg.Membership.Members()
	if !v.Changes.Claims && prev.claims != nil {
		v.claims = prev.claims.with(v.Statuses, v.Members)
	} else {
		v.claims = newClaims(v.Statuses, vs.held, v.Members)
	}
	var prevAlive *Alive
	if prev != nil {
		prevAlive = &prev.aliveFrom
	}
	v.aliveFrom, _ = vs.cfg.Damping.AliveAfter(now, v.Members, prevAlive)
	v.Alive, v.settleAt = SettlingOut(v.aliveFrom.Set, v.Statuses, vs.cfg.Self, now, vs.cfg.RejoinSettle)
	v.Stale = StaleRecords(v.Members, v.Alive, v.Statuses, vs.cfg.Self)
	if s, ok := v.Statuses[vs.cfg.Self]; ok && EarlierRun(s, vs.cfg.Started) {
		v.OldSelf = vs.cfg.Self
	}
	v.Excluded = vs.cfg.Acks.excluded(now)
	lbInto(v, prev, lbForbidden(vs.cfg)) // the pool is a ConfigMap: a record of another kind than the rest reads
	if sameStatuses && !v.Changes.Objects && !v.lbChanged && maps.Equal(prev.Alive, v.Alive) && maps.Equal(prev.Stale, v.Stale) && maps.Equal(prev.Excluded, v.Excluded) &&
		(prev.reclaimAt.IsZero() || now.Before(prev.reclaimAt)) {
		// Nothing the rest is computed from changed (a membership event
		// that moved no one, a record of another kind), and no
		// reservation that beat a subnet claim expired.
		v.reclaimAt = prev.reclaimAt
		v.claimWinners = prev.claimWinners
		v.Winners, v.Eligible, v.nodesKey, v.placementKey, v.Placement, v.Owner = prev.Winners, prev.Eligible, prev.nodesKey, prev.placementKey, prev.Placement, prev.Owner
		v.plain, v.plainWithout, v.Away = prev.plain, prev.plainWithout, prev.Away
		v.given, v.Own = prev.given, prev.Own
		v.SvcPorts, v.unlisted = prev.SvcPorts, prev.unlisted
		v.VolumeClaims, v.pins = prev.VolumeClaims, prev.pins
	} else {
		vs.derive(v, prev, selfHeld)
	}
	for _, x := range vs.cfg.Acks.observe(now, v.unlisted, (len(v.Eligible)-1)/2) {
		vs.cfg.Log.Warn("a node does not list the replicas placed on it (it says it is ready but does not run them); placing nothing on it for a while",
			"node", api.OneLine(x.node), "unlistedFor", vs.cfg.Acks.timeout, "excludedFor", x.for_)
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
func (vs *Builder) derive(v, prev *View, gens bool) {
	sameClaims := gens && !v.Changes.Claims
	switch {
	case sameClaims:
		v.claimWinners = prev.claimWinners
	case gens:
		v.claimWinners = maps.Clone(vs.claims.winners)
	default:
		v.claimWinners = WinningClaims(v.Statuses) // with this node's unpublished record
	}
	// From the claims' winners each time, never from prev.winners: a node
	// that took a dead node's subnet stops winning when that node is back.
	v.Winners = vs.reclaimedWinners(v)
	if sameClaims && !v.Changes.Nodes && maps.Equal(prev.Alive, v.Alive) && maps.Equal(prev.Winners, v.Winners) {
		v.Eligible, v.nodesKey = prev.Eligible, prev.nodesKey
	} else {
		v.Eligible = eligibleNodes(v.Alive, v.Statuses, v.Winners)
		v.nodesKey = nodesKey(v.Eligible)
	}
	// Placement's own inputs, not the records': an annotation or an
	// image change of a workload moves nothing.
	v.VolumeClaims = BindClaims(v.ClaimObjects, v.Statuses)
	v.pins = pinsOf(v.Workloads, v.VolumeClaims)
	v.placementKey = v.workloadsKey + "|" + v.nodesKey + "|" + setKey(v.Excluded) + "|" + pinsKey(v.pins)
	sameInputs := prev != nil && prev.placementKey == v.placementKey
	if sameInputs {
		v.plain, v.plainWithout = prev.plain, prev.plainWithout
	} else {
		v.plain, v.plainWithout = assign(v.Eligible, v.Workloads, v.Excluded, v.pins)
		if vs.cfg.Placements != nil {
			vs.cfg.Placements.Inc()
		}
	}
	// What the nodes run away from placement's choice stays there
	// (placement.Keep): the records that changed are read on each derive.
	v.Away = vs.away.Elsewhere(!sameInputs, v.plain, v.plainWithout, v.Eligible, v.Statuses, v.Stale)
	if sameInputs && SameHolders(prev.Away, v.Away) {
		v.Placement, v.Owner, v.given, v.Own = prev.Placement, prev.Owner, prev.given, prev.Own
		if prev.objectsKey != v.objectsKey {
			// Same placement, other objects (an annotation): this
			// node's replicas are the new expansions.
			v.Own = OwnedBy(vs.cfg.Self, v.All, v.Owner)
		}
	} else {
		v.Placement, v.Owner = place(v.plain, v.plainWithout, v.Eligible, v.Workloads, v.All, v.Excluded, v.Away, v.pins)
		v.given, v.Own = givenSlots(v.All, v.Placement), OwnedBy(vs.cfg.Self, v.All, v.Owner)
	}
	vs.ServicesInto(v, prev)
	// Nodes are judged on what placement gives them before anyone is
	// left out: a node that runs what it was given is never blamed for
	// replicas this node's exclusions moved to it (and others did not).
	// A node does not judge itself, and leaves at most a minority out.
	v.unlisted = unreported(v.given, v.Statuses)
	delete(v.unlisted, vs.cfg.Self)
	if vs.cfg.Acks.timeout <= 0 {
		v.unlisted = nil // the check is off (--ack-timeout 0)
	}
}
