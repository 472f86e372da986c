package node

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/manifest"
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
	// selfStatus is this node's record before it published one.
	selfStatus func() NodeStatus

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
}

// cachedObject and cachedStatus are decoded records with what they were
// decoded from: the version, origin and value (a tie or a reused version
// with another value must not keep the old decoding).
type cachedObject struct {
	from recordID
	obj  manifest.Object
	ok   bool
}

type cachedStatus struct {
	from   recordID
	status NodeStatus
	ok     bool
}

// recordID is what a cache entry was decoded from. The value is kept as
// the record held it and compared byte for byte: converting it to a
// string for each record on each rebuild copied every status record, 10
// % of the CPU at 1,000 simulated nodes.
type recordID struct {
	version hlc.Timestamp
	origin  string
	value   []byte
}

func idOf(r crdt.Record) recordID { return recordID{r.Version, r.Origin, r.Value} }

// same reports whether r is the record id was taken from.
func (id recordID) same(r crdt.Record) bool {
	return id.version == r.Version && id.origin == r.Origin && bytes.Equal(id.value, r.Value)
}

func newViews() *views {
	return &views{next: make(chan struct{}), objects: map[string]cachedObject{}, statuses: map[string]cachedStatus{}, held: map[string]NodeStatus{},
		claims: newClaimIndex()}
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
// the nodes left out of placement differ, at now, from v's, or a node
// has gone unlisted for --ack-timeout (the build would exclude it).
func (vs *views) timeInputsChanged(v *view, now time.Time) bool {
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
	v.excluded = vs.acks.excluded(now)
	if sameStatuses && prev.objGen == v.objGen && maps.Equal(prev.alive, v.alive) && maps.Equal(prev.excluded, v.excluded) {
		// Nothing the rest is computed from changed (a membership event
		// that moved no one, a record of another kind).
		v.winners, v.eligible, v.nodesKey, v.placementKey, v.placement, v.base, v.owner = prev.winners, prev.eligible, prev.nodesKey, prev.placementKey, prev.placement, prev.base, prev.owner
		v.ports, v.unlisted = prev.ports, prev.unlisted
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
		v.winners = prev.winners
	case gens:
		v.winners = maps.Clone(vs.claims.winners)
	default:
		v.winners = winningClaims(v.statuses) // with this node's unpublished record
	}
	if sameClaims && prev.nodesGen == v.nodesGen && maps.Equal(prev.alive, v.alive) {
		v.eligible, v.nodesKey = prev.eligible, prev.nodesKey
	} else {
		v.eligible = eligibleNodes(v.alive, v.statuses, v.winners)
		v.nodesKey = nodesKey(v.eligible)
	}
	// Placement's own inputs, not the records': an annotation or an
	// image change of a workload moves nothing.
	v.placementKey = v.workloadsKey + "|" + v.nodesKey + "|" + setKey(v.excluded)
	if prev != nil && prev.placementKey == v.placementKey {
		v.placement, v.base, v.owner = prev.placement, prev.base, prev.owner
	} else {
		v.placement, v.base, v.owner = place(v.eligible, v.workloads, v.all, v.excluded)
		vs.placements.Inc()
	}
	v.ports = servicePorts(v.services, v.alloc, v.workloads, readyEndpoints(v.alive, v.statuses, v.winners))
	// Nodes are judged on what placement gives them before anyone is
	// left out: a node that runs what it was given is never blamed for
	// replicas this node's exclusions moved to it (and others did not).
	// A node does not judge itself, and leaves at most a minority out.
	v.unlisted = unreported(v.all, v.base, v.statuses)
	delete(v.unlisted, vs.self)
	if vs.acks.timeout <= 0 {
		v.unlisted = nil // the check is off (--ack-timeout 0)
	}
}

// objectsInto sets v's desired objects and what is computed from them,
// sharing prev's when none of their records changed (by the store's
// changed keys, then by the records themselves).
func (vs *views) objectsInto(v, prev *view) error {
	if prev != nil && prev.objGen == v.objGen {
		v.objectsKey, v.workloadsKey = prev.objectsKey, prev.workloadsKey
		v.workloads, v.all, v.services, v.alloc, v.hashes, v.probes = prev.workloads, prev.all, prev.services, prev.alloc, prev.hashes, prev.probes
		return nil
	}
	var wrecs []crdt.Record
	for _, kind := range []string{manifest.KindDeployment, manifest.KindStatefulSet} {
		rs, err := vs.store.List(kindPrefix(kind))
		if err != nil {
			return err
		}
		wrecs = append(wrecs, rs...)
	}
	srecs, err := vs.store.List(kindPrefix(manifest.KindService))
	if err != nil {
		return err
	}
	v.objectsKey = recordsKey(wrecs) + "|" + recordsKey(srecs)
	if prev != nil && prev.objectsKey == v.objectsKey {
		v.workloadsKey = prev.workloadsKey
		v.workloads, v.all, v.services, v.alloc, v.hashes, v.probes = prev.workloads, prev.all, prev.services, prev.alloc, prev.hashes, prev.probes
		return nil
	}
	seen := map[string]bool{}
	v.workloads = vs.decodeObjects(wrecs, seen)
	v.services = vs.decodeObjects(srecs, seen)
	for k := range vs.objects {
		if !seen[k] {
			delete(vs.objects, k)
		}
	}
	v.all = desiredReplicas(v.workloads)
	v.hashes, v.probes = currentProbes(v.workloads)
	v.alloc = service.Allocate(serviceSpecs(v.services), vs.serviceCIDR)
	v.workloadsKey = workloadsKey(v.workloads)
	return nil
}

// decodeObjects returns the live objects of recs, sorted by key, decoding
// only records whose version changed since the last build; it marks their
// keys in seen. Objects that do not decode are logged once and skipped.
func (vs *views) decodeObjects(recs []crdt.Record, seen map[string]bool) []manifest.Object {
	var out []manifest.Object
	for _, r := range recs {
		if r.Deleted {
			continue
		}
		seen[r.Key] = true
		c, ok := vs.objects[r.Key]
		if !ok || !c.from.same(r) {
			o, err := manifest.Decode(r.Value)
			c = cachedObject{from: idOf(r), obj: o, ok: err == nil}
			vs.objects[r.Key] = c
			if err != nil {
				vs.log.Error("stored object does not decode; skipped", "key", r.Key, "err", err)
			}
		}
		if c.ok {
			out = append(out, c.obj)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// sync brings held (and the status cache) up to date with the store's
// changed keys, and counts the changes to statuses and desired objects
// (heldGen, objGen). Only the changed records are read and decoded; a
// purge, a drop or the first sync relists them all. Called with build
// held.
func (vs *views) sync() error {
	var keys []string
	all := true
	t, _ := vs.store.(*tracked)
	if t != nil {
		keys, all = t.take()
	}
	// A read that fails leaves the changes unread: the next sync reads
	// everything again.
	failed := func(err error) error {
		if t != nil {
			t.setAll()
		}
		return err
	}
	if all {
		recs, err := vs.store.List(statusKind + "/")
		if err != nil {
			return failed(err)
		}
		vs.held = vs.decodeStatusesCached(recs)
		vs.claims = newClaimIndex()
		for name, st := range vs.held {
			vs.claims.set(name, st, true)
		}
		vs.heldGen++
		vs.objGen++
		vs.claimsGen++
		vs.nodesGen++
		return nil
	}
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, kindPrefix(manifest.KindDeployment)), strings.HasPrefix(k, kindPrefix(manifest.KindStatefulSet)),
			strings.HasPrefix(k, kindPrefix(manifest.KindService)):
			vs.objGen++
		case strings.HasPrefix(k, statusKind+"/"):
			r, ok, err := vs.store.Get(k)
			if err != nil {
				return failed(err)
			}
			vs.heldGen++
			old, had := vs.statuses[k]
			had = had && old.ok
			if had {
				delete(vs.held, old.status.Name)
			}
			var c cachedStatus
			if ok {
				c = vs.decodeStatus(r)
			} else {
				delete(vs.statuses, k)
			}
			if c.ok {
				vs.held[c.status.Name] = c.status
			}
			if had != c.ok || had && !sameClaim(old.status, c.status) {
				vs.claimsGen++
				if had {
					vs.claims.set(old.status.Name, NodeStatus{}, false)
				}
				if c.ok {
					vs.claims.set(c.status.Name, c.status, true)
				}
			}
			if had != c.ok || had && !samePlacement(old.status, c.status) {
				vs.nodesGen++
			}
		}
	}
	return nil
}

// withHeld calls f with the node statuses the store holds now, by name,
// and the versions of their records, decoding only the records that changed since the last look (checking
// a new subnet claim against all of them listed and compared every
// record: 1,000 claims x 1,000 records at each of 1,000 simulated nodes
// forming). f must not keep or modify the map.
func (vs *views) withHeld(f func(held map[string]NodeStatus, version func(name string) hlc.Timestamp)) {
	vs.build.Lock()
	defer vs.build.Unlock()
	if err := vs.sync(); err != nil {
		vs.log.Error("read the node statuses", "err", err)
	}
	f(vs.held, func(name string) hlc.Timestamp { return vs.statuses[statusKey(name)].from.version })
}

// claimsNear returns the held statuses whose subnet claim overlaps s's
// (s's own held one included), found through the claim index: a new
// claim is checked against these, not against every node's.
func (vs *views) claimsNear(s NodeStatus) []NodeStatus {
	vs.build.Lock()
	defer vs.build.Unlock()
	if err := vs.sync(); err != nil {
		vs.log.Error("read the node statuses", "err", err)
	}
	var out []NodeStatus
	p, ok := s.prefix()
	if !ok {
		for _, h := range vs.held {
			if h.PodSubnet == s.PodSubnet {
				out = append(out, h)
			}
		}
		return out
	}
	vs.claims.near(p, func(name string) {
		if h, ok := vs.held[name]; ok {
			if hp, ok := h.prefix(); ok && hp.Overlaps(p) {
				out = append(out, h)
			}
		}
	})
	return out
}

// decodeStatusesCached is decodeStatuses over the cache of decoded
// status records. Called with build held.
func (vs *views) decodeStatusesCached(recs []crdt.Record) map[string]NodeStatus {
	out := map[string]NodeStatus{}
	seen := map[string]bool{}
	for _, r := range recs {
		seen[r.Key] = true
		if c := vs.decodeStatus(r); c.ok {
			out[c.status.Name] = c.status
		}
	}
	for k := range vs.statuses {
		if !seen[k] {
			delete(vs.statuses, k)
		}
	}
	return out
}

// decodeStatus decodes status record r through the cache. Called with
// build held.
func (vs *views) decodeStatus(r crdt.Record) cachedStatus {
	c, ok := vs.statuses[r.Key]
	if ok && c.from.same(r) {
		return c
	}
	c = cachedStatus{from: idOf(r)}
	for _, s := range decodeStatuses([]crdt.Record{r}, vs.clusterCIDR) {
		c.status, c.ok = s, true
	}
	vs.statuses[r.Key] = c
	return c
}
