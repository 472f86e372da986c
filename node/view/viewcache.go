package view

import (
	"bytes"
	"sort"
	"strings"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// The view builder's caches: decoded records by key, the statuses held
// (kept up to date from the store's changed keys) and the desired objects
// (snapshot.go builds the view from them).

// cachedObject and cachedStatus are decoded records with what they were
// decoded from: the version, origin and value (a tie or a reused version
// with another value must not keep the old decoding).
type cachedObject struct {
	from recordID
	obj  manifest.Object
	ok   bool
	// replicas are obj's replicas (DesiredReplicas), once expanded is
	// set (AllReplicas).
	replicas expansion
	expanded bool
}

// expansion is one workload's replicas in compact form: what they all
// share (tmpl, a Replica without ID, Name and Ordinal) and, sorted by ID,
// what each has of its own. A replica costs 40 bytes in it, where a
// reconcile.Replica is about 500 (its Spec): a cache of every workload's
// Replicas would double what a node holds of the cluster's replicas.
type expansion struct {
	tmpl *reconcile.Replica
	refs []ReplicaRef
}

type ReplicaRef struct {
	Id, name string
	ordinal  int
}

// expand is DesiredReplicas of o alone, in compact form.
func expand(o manifest.Object) expansion {
	rs := DesiredReplicas([]manifest.Object{o})
	e := expansion{refs: make([]ReplicaRef, len(rs))}
	for i, r := range rs {
		e.refs[i] = ReplicaRef{r.ID, r.Name, r.Ordinal}
	}
	if len(rs) > 0 {
		t := rs[0]
		t.ID, t.Name, t.Ordinal = "", "", 0
		e.tmpl = &t
	}
	return e
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
	signer  []byte
	sig     []byte
}

func idOf(r crdt.Record) recordID { return recordID{r.Version, r.Origin, r.Value, r.Signer, r.Sig} }

// same reports whether r is the record id was taken from, signature
// included: a copy of a record re-signed by another key is another
// record (the arrival check refuses it; what was decoded from it must
// not stand for the record held).
func (id recordID) same(r crdt.Record) bool {
	return id.version == r.Version && id.origin == r.Origin && bytes.Equal(id.value, r.Value) &&
		bytes.Equal(id.signer, r.Signer) && bytes.Equal(id.sig, r.Sig)
}

// objectsInto sets v's desired objects and what is computed from them,
// sharing prev's when none of their records changed (by the store's
// changed keys, then by the records themselves).
func (vs *Builder) objectsInto(v, prev *View) error {
	if !v.Changes.Objects {
		v.objectsKey, v.workloadsKey = prev.objectsKey, prev.workloadsKey
		v.Workloads, v.All, v.Services, v.Alloc, v.SvcIndex, v.Hashes, v.Probes = prev.Workloads, prev.All, prev.Services, prev.Alloc, prev.SvcIndex, prev.Hashes, prev.Probes
		return nil
	}
	var wrecs []crdt.Record
	for _, kind := range []string{manifest.KindDeployment, manifest.KindStatefulSet} {
		rs, err := vs.cfg.Records.List(KindPrefix(kind))
		if err != nil {
			return err
		}
		wrecs = append(wrecs, rs...)
	}
	srecs, err := vs.cfg.Records.List(KindPrefix(manifest.KindService))
	if err != nil {
		return err
	}
	v.objectsKey = recordsKey(wrecs) + "|" + recordsKey(srecs)
	if prev != nil && prev.objectsKey == v.objectsKey {
		v.workloadsKey = prev.workloadsKey
		v.Workloads, v.All, v.Services, v.Alloc, v.SvcIndex, v.Hashes, v.Probes = prev.Workloads, prev.All, prev.Services, prev.Alloc, prev.SvcIndex, prev.Hashes, prev.Probes
		return nil
	}
	seen := map[string]bool{}
	v.Workloads = vs.DecodeObjects(wrecs, seen)
	v.Services = vs.DecodeObjects(srecs, seen)
	for k := range vs.objects {
		if !seen[k] {
			delete(vs.objects, k)
		}
	}
	if vs.cfg.Share != nil {
		v.All = vs.cfg.Share.replicaSet(recordsKey(wrecs), func() []DesiredReplica { return vs.AllReplicas(wrecs) })
	} else {
		v.All = vs.AllReplicas(wrecs)
	}
	v.Hashes, v.Probes = currentProbes(v.Workloads)
	v.Alloc = service.Allocate(ServiceSpecs(v.Services), vs.cfg.ServiceCIDR)
	v.SvcIndex = NewServiceIndex(v.Services, v.Workloads)
	v.workloadsKey = workloadsKey(v.Workloads)
	return nil
}

// AllReplicas is DesiredReplicas of the workloads decoded from recs (by
// DecodeObjects, just before), from the expansion cached with each
// object: a write expands only its own workload's replicas, and the
// others are merged in, in ID order.
func (vs *Builder) AllReplicas(recs []crdt.Record) []DesiredReplica {
	var parts []expansion
	total := 0
	for _, r := range recs {
		c, ok := vs.objects[r.Key]
		if r.Deleted || !ok || !c.ok || !c.obj.IsWorkload() {
			continue
		}
		if !c.expanded {
			c.replicas, c.expanded = expand(c.obj), true
			vs.objects[r.Key] = c
			vs.cfg.Share.putObject(r, c)
		}
		parts = append(parts, c.replicas)
		total += len(c.replicas.refs)
	}
	return mergeByID(parts, total)
}

// mergeByID merges expansions into one slice of total replicas sorted by
// ID: a k-way merge through a heap of the expansions' heads, O(total log
// k) comparisons and one write of each replica.
func mergeByID(parts []expansion, total int) []DesiredReplica {
	if total == 0 {
		return nil
	}
	out := make([]DesiredReplica, 0, total)
	h := make([]expansion, 0, len(parts))
	for _, p := range parts {
		if len(p.refs) > 0 {
			h = append(h, p)
		}
	}
	less := func(i, j int) bool { return h[i].refs[0].Id < h[j].refs[0].Id }
	down := func(i int) {
		for {
			l, m := 2*i+1, i
			if l < len(h) && less(l, m) {
				m = l
			}
			if r := l + 1; r < len(h) && less(r, m) {
				m = r
			}
			if m == i {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		down(i)
	}
	for len(h) > 0 {
		out = append(out, DesiredReplica{h[0].refs[0], h[0].tmpl})
		if h[0].refs = h[0].refs[1:]; len(h[0].refs) == 0 {
			h[0] = h[len(h)-1]
			h = h[:len(h)-1]
		}
		down(0)
	}
	return out
}

// DecodeObjects returns the live objects of recs, sorted by key, decoding
// only records whose version changed since the last build; it marks their
// keys in seen. Objects that do not decode are logged once and skipped.
func (vs *Builder) DecodeObjects(recs []crdt.Record, seen map[string]bool) []manifest.Object {
	var out []manifest.Object
	for _, r := range recs {
		if r.Deleted {
			continue
		}
		seen[r.Key] = true
		c, ok := vs.objects[r.Key]
		if !ok || !c.from.same(r) {
			if checked, ok := vs.cfg.Checked.takeObject(r); ok {
				c = checked
				vs.cfg.Share.putObject(r, c)
			} else if shared, ok := vs.cfg.Share.object(r); ok {
				c = shared
			} else {
				o, err := manifest.Decode(r.Value)
				c = cachedObject{from: idOf(r), obj: o, ok: err == nil}
				if err != nil {
					vs.cfg.Log.Error("stored object does not decode; skipped", "key", r.Key, "err", err)
				}
				vs.cfg.Share.putObject(r, c)
			}
			vs.objects[r.Key] = c
		}
		if c.ok {
			out = append(out, c.obj)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// sync brings held (and the status cache) up to date with the store's
// changed keys, and notes what changed in pending. Only the changed records are read and decoded; a
// purge, a drop or the first sync relists them all. Called with build
// held.
func (vs *Builder) sync() error {
	keys, all := vs.cfg.Records.Take()
	// A read that fails leaves the changes unread: the next sync reads
	// everything again.
	failed := func(err error) error {
		vs.cfg.Records.SetAll()
		return err
	}
	if all {
		recs, err := vs.cfg.Records.List(StatusKind + "/")
		if err != nil {
			return failed(err)
		}
		vs.held = vs.decodeStatusesCached(recs)
		vs.claims = newClaimIndex()
		for name, st := range vs.held {
			vs.claims.set(name, st, true)
		}
		vs.pending = everything
		return nil
	}
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, KindPrefix(manifest.KindDeployment)), strings.HasPrefix(k, KindPrefix(manifest.KindStatefulSet)),
			strings.HasPrefix(k, KindPrefix(manifest.KindService)):
			vs.pending.Objects = true
		case strings.HasPrefix(k, StatusKind+"/"):
			r, ok, err := vs.cfg.Records.Get(k)
			if err != nil {
				return failed(err)
			}
			vs.pending.Statuses = true
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
			if had != c.ok || had && !SameClaim(old.status, c.status) {
				vs.pending.Claims = true
				if had {
					vs.claims.set(old.status.Name, NodeStatus{}, false)
				}
				if c.ok {
					vs.claims.set(c.status.Name, c.status, true)
				}
			}
			if had != c.ok || had && !samePlacement(old.status, c.status) {
				vs.pending.Nodes = true
			}
		}
	}
	return nil
}

// decodeStatusesCached is DecodeStatuses over the cache of decoded
// status records. Called with build held.
func (vs *Builder) decodeStatusesCached(recs []crdt.Record) map[string]NodeStatus {
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
func (vs *Builder) decodeStatus(r crdt.Record) cachedStatus {
	c, ok := vs.statuses[r.Key]
	if ok && c.from.same(r) {
		return c
	}
	if c, ok := vs.cfg.Checked.take(r); ok {
		vs.statuses[r.Key] = c
		vs.cfg.Share.putStatus(r, c)
		return c
	}
	if c, ok := vs.cfg.Share.status(r); ok {
		vs.statuses[r.Key] = c
		return c
	}
	c = cachedStatus{from: idOf(r)}
	for _, s := range DecodeStatuses([]crdt.Record{r}, vs.cfg.ClusterCIDR) {
		c.status, c.ok = s, true
	}
	vs.statuses[r.Key] = c
	vs.cfg.Share.putStatus(r, c)
	return c
}
