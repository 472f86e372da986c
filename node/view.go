package node

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/placement"
)

// view is one consistent reading of the cluster as this node sees it:
// live members, node records, Deployments, every desired replica and
// where placement puts it.
type view struct {
	alive     map[string]bool
	statuses  map[string]NodeStatus
	workloads []manifest.Object // Deployments and StatefulSets
	all       []reconcile.Replica
	placement placement.Placement
	owner     map[string]string // replica ID -> node
	// excluded are the nodes left out of placement for not listing the
	// replicas placed on them (unresponsive.go).
	excluded map[string]bool
}

// readView reads the store and membership and computes placement.
func (a *Agent) readView() (view, error) {
	var v view
	var recs []crdt.Record
	for _, kind := range []string{manifest.KindDeployment, manifest.KindStatefulSet} {
		rs, err := a.store.List(kindPrefix(kind))
		if err != nil {
			return v, err
		}
		recs = append(recs, rs...)
	}
	objs, bad := liveObjects(recs)
	for _, k := range bad {
		a.log.Error("stored object does not decode; skipped", "key", k)
	}
	nodeRecs, err := a.store.List(statusKind + "/")
	if err != nil {
		return v, err
	}
	v.statuses = decodeStatuses(nodeRecs, a.clusterCIDR)
	if _, ok := v.statuses[a.cfg.Name]; !ok {
		v.statuses[a.cfg.Name] = a.selfStatus(nil)
	}
	v.alive = a.aliveMembers()
	v.workloads = objs
	v.all = desiredReplicas(objs)
	now := time.Now()
	v.excluded = a.acks.excluded(now)
	var base map[string]string
	eligible := eligibleNodes(v.alive, v.statuses)
	v.placement, base, v.owner = place(eligible, objs, v.all, v.excluded)
	// Nodes are judged on what placement gives them before anyone is
	// left out: a node that runs what it was given is never blamed for
	// replicas this node's exclusions moved to it (and others did not).
	// A node does not judge itself, and leaves at most a minority out.
	unlisted := unreported(v.all, base, v.statuses)
	delete(unlisted, a.cfg.Name)
	if a.cfg.AckTimeout <= 0 {
		unlisted = nil // the check is off (--ack-timeout 0)
	}
	for _, x := range a.acks.observe(now, unlisted, (len(eligible)-1)/2) {
		a.log.Warn("a node does not list the replicas placed on it (it says it is ready but does not run them); placing nothing on it for a while",
			"node", oneLine(x.node), "unlistedFor", a.acks.timeout, "excludedFor", x.for_)
	}
	return v, nil
}

// place runs placement (rendezvous hashing with bounded loads, package
// placement) over the eligible nodes and returns it with each replica's
// owner (replica ID -> node) before (base) and after (owner) leaving out
// the excluded nodes. Nodes in excluded (they do not list what
// they are given: unresponsive.go) are left out of Deployments' placement
// only: a StatefulSet replica (at most one copy) must not move off a live
// node on this node's judgement, which others may not share yet, and a
// fenced node rightly stops listing its StatefulSet replicas.
func place(nodes []placement.Node, objs []manifest.Object, all []reconcile.Replica, excluded map[string]bool) (p placement.Placement, base, owner map[string]string) {
	p = placement.Assign(nodes, workloadsOf(objs), placement.Options{})
	base = owners(all, p)
	owner = maps.Clone(base)
	if len(excluded) == 0 {
		return p, base, owner
	}
	kept := slices.DeleteFunc(slices.Clone(nodes), func(n placement.Node) bool { return excluded[n.Name] })
	without := placement.Assign(kept, workloadsOf(objs), placement.Options{})
	for _, r := range all {
		if !r.AtMostOne {
			owner[r.ID] = without.Owner(workloadKey(r.Namespace, r.Workload), r.Ordinal)
		}
	}
	return p, base, owner
}

// selfStatus is this node's record with the given replica statuses. It
// says only what peers accept (checkStatus): reasons are one line of
// bounded text, and a replica address outside the node's current subnet
// (left from an earlier claim) is not published.
func (a *Agent) selfStatus(replicas []api.Replica) NodeStatus {
	claim := a.currentClaim()
	subnet, _ := netip.ParsePrefix(claim.Subnet)
	out := make([]api.Replica, 0, len(replicas))
	for _, r := range replicas {
		r.Reason = oneLine(r.Reason)
		if ip, err := netip.ParseAddr(r.PodIP); r.PodIP != "" && (err != nil || !subnet.Contains(ip)) {
			r.PodIP, r.Ready = "", false
		}
		out = append(out, r)
	}
	return NodeStatus{
		Name:        a.cfg.Name,
		Advertise:   a.advertiseHost(),
		API:         a.apiURL(),
		PodSubnet:   claim.Subnet,
		SubnetSince: claim.Since,
		SubnetReady: a.subnetIsReady(),
		Capacity:    a.capacity,
		Labels:      a.cfg.Labels,
		Started:     a.started.UTC().Truncate(time.Second),
		Replicas:    out,
		Insecure:    a.cfg.Insecure,
		Cert:        a.trust.certDER(),
	}
}

// publishStatus gossips this node's record when it changed since the last
// publication, or when the stored record is not the one this node wrote
// last: a delete or a write under this node's name by another node (which
// checkRecord refuses on arrival, but which could predate the check, or
// come from "starling node forget" run against a live node) is overwritten
// at once, not at the next change.
func (a *Agent) publishStatus(local []api.Replica) {
	b, err := json.Marshal(a.selfStatus(local))
	if err != nil {
		return
	}
	if string(b) == a.lastStatus {
		rec, ok, err := a.store.Get(statusKey(a.cfg.Name))
		own := ok && !rec.Deleted && rec.Origin == a.cfg.Name && bytes.Equal(rec.Signer, a.id.public())
		if err != nil || own && string(rec.Value) == a.lastStatus {
			return
		}
		if ok {
			a.log.Warn("this node's status record was changed by another writer; republishing it", "writer", oneLine(rec.Origin),
				"key", keyID(rec.Signer), "deleted", rec.Deleted)
			a.clock.Update(rec.Version)
		}
	}
	rec := crdt.Record{Key: statusKey(a.cfg.Name), Value: b, Version: a.clock.Now(), Origin: a.cfg.Name}
	if err := a.publish(rec); err != nil {
		a.log.Warn("publish node status", "err", err)
		return
	}
	a.lastStatus = string(b)
}
