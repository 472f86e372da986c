package node

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/placement"
)

// view is one consistent, immutable reading of the cluster as this node
// sees it (snapshot.go builds it): live members, node records, desired
// objects decoded once, every desired replica and where placement puts
// it, the Services' allocation and endpoints. Its maps and slices are
// shared by every reader: never modify them.
type view struct {
	built time.Time
	// members is the membership as gossip gave it (routes follow it,
	// without flap damping); alive the members that count for placement
	// (aliveMembers).
	members   []gossip.Member
	alive     map[string]bool
	statuses  map[string]NodeStatus
	workloads []manifest.Object // Deployments and StatefulSets
	all       []reconcile.Replica
	placement placement.Placement
	// base and owner map replica ID -> node, before and after leaving
	// out the excluded nodes (place).
	base, owner map[string]string
	// excluded are the nodes left out of placement for not listing the
	// replicas placed on them (unresponsive.go).
	excluded map[string]bool
	// hashes are the workloads' current spec hashes by workload key, and
	// probes the probes of their current templates (currentProbes).
	hashes map[string]string
	probes map[string]probe.Probes
	// services are the Services, alloc their ClusterIPs and NodePorts,
	// ports the dataplane input (serviceView).
	services []manifest.Object
	alloc    service.Allocation
	ports    []service.Port
	// objectsKey and placementKey identify the inputs the desired
	// objects and placement were computed from: a rebuild whose inputs
	// are unchanged reuses them.
	objectsKey, placementKey string
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
	status := a.selfStatus(local)
	b, err := json.Marshal(status)
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
	a.local.Store(&status.Replicas)
	rec := crdt.Record{Key: statusKey(a.cfg.Name), Value: b, Version: a.clock.Now(), Origin: a.cfg.Name}
	if err := a.publish(rec); err != nil {
		a.log.Warn("publish node status", "err", err)
		return
	}
	a.lastStatus = string(b)
}
