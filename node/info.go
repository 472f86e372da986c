package node

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
	"github.com/starling-orchestrator/starling/node/member"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

// info is what this node knows of the cluster, as the API shows it:
// every replica, the members, and forgetting a node that is gone. It
// implements apiserver.Info.
type info struct {
	self    string
	views   *view.Builder
	status  *self
	cluster *gossip.Cluster
	store   Store
	clock   *hlc.Clock
	id      *trust.Identity
	writer  *writer
	join    *trust.Admission // nil with --insecure
	keys    *trust.Keyring   // nil with --insecure
	// certified reports whether a member is a node (memberAuth.certified;
	// nil: every member is): get nodes lists nodes, not phantoms.
	certified certifier
	log       *slog.Logger
}

var _ apiserver.Info = (*info)(nil)

// Version is this agent's version and node name.
func (in *info) Version() api.Version { return api.Version{Version: Version, Node: in.self} }

// Replicas is the whole cluster's replicas as this node sees them: its
// own, live observation, the others' from their gossiped status records
// (dead and left nodes do not count), and desired replicas that no node
// reports yet (Pending, with the node placement gave them).
//
// It reads only the snapshot and the list of this node's replicas its last
// reconcile pass published (self.replicas): no lock, no call to containerd.
func (in *info) Replicas() []api.Replica {
	v := in.views.View()
	var items []api.Replica
	if local, ok := in.status.replicas(); ok {
		items = slices.Clone(local)
	} else if _, ok := v.Statuses[in.self]; ok {
		items = slices.Clone(v.Reported(in.self)) // no pass yet: what it last said
	}
	reported := map[string]bool{}
	for _, r := range items {
		reported[r.Namespace+"/"+r.Name] = true
	}
	for name := range v.Statuses {
		if name == in.self || !v.Alive[name] {
			continue
		}
		for _, r := range v.Reported(name) {
			items = append(items, r)
			reported[r.Namespace+"/"+r.Name] = true
		}
	}
	// Ordinals that run a copy somewhere, with its spec.
	running := map[string]string{}
	for _, r := range items {
		running[slotOf(r.Namespace, r.Workload, r.Ordinal)] = r.SpecHash
	}
	for _, dr := range v.All {
		d := dr.Replica()
		if reported[d.Namespace+"/"+d.Name] {
			continue
		}
		item := api.Replica{Name: d.Name, Namespace: d.Namespace, Workload: d.Workload, Ordinal: d.Ordinal,
			Node: v.Owner.Of(d.ID), SpecHash: d.SpecHash, Phase: api.PhasePending}
		switch spec, ok := running[slotOf(d.Namespace, d.Workload, d.Ordinal)]; {
		case item.Node == "":
			item.Reason = v.Placement.Pending[reconcile.WorkloadKey(d.Namespace, d.Workload)][d.Ordinal]
		case ok && spec != d.SpecHash:
			// Its owner keeps the copy of the other spec: the rolling
			// update's budget (maxSurge, maxUnavailable, in ordinal
			// order) has not reached this ordinal.
			item.Reason = "waiting for the rolling update to reach this ordinal"
		}
		items = append(items, item)
	}
	api.SortReplicas(items)
	return items
}

// Nodes lists the members with what their records say.
func (in *info) Nodes() []api.Node {
	v := in.views.View()
	out := []api.Node{}
	for _, m := range in.cluster.Members() {
		if in.certified != nil && !in.certified.certified(m.Name) {
			continue
		}
		n := api.Node{Name: m.Name, State: string(m.State), Address: m.Addr, Unresponsive: v.Excluded[m.Name]}
		if s, ok := v.Statuses[m.Name]; ok {
			n.PodSubnet, n.Started, n.API, n.Ready, n.Insecure, n.DiskFull = s.PodSubnet, s.Started, s.API, s.SubnetReady, s.Insecure, s.DiskFull
			n.Replicas = v.Holding(m.Name)
		}
		if meta, ok := member.DecodeMeta(m.Meta); ok && meta.Since > 0 {
			n.Joined = time.Unix(0, meta.Since).UTC()
		}
		if rtt, ok := in.cluster.RTT(m.Name); ok && m.Name != in.self {
			n.RTT = rtt.Round(10 * time.Microsecond).String()
		}
		out = append(out, n)
	}
	return out
}

// Forget deletes the record of a node that is dead or left, so its
// subnet is free at once instead of after --subnet-reclaim-after.
func (in *info) Forget(ctx context.Context, name string) (api.ForgetResult, error) {
	for _, m := range in.cluster.Members() {
		if m.Name == name && (m.State.Up()) {
			return api.ForgetResult{}, api.Errorf(http.StatusConflict, "node %s is %s: only a dead or departed node can be forgotten", name, m.State)
		}
	}
	if name == in.self {
		return api.ForgetResult{}, api.Errorf(http.StatusConflict, "node %s is this node", name)
	}
	if _, ok, err := in.store.Get(view.StatusKey(name)); err != nil || !ok {
		return api.ForgetResult{}, api.Errorf(http.StatusNotFound, "node %q is not known", name)
	}
	revoked, err := in.forgetNode(name)
	if err != nil {
		return api.ForgetResult{}, err
	}
	res := api.ForgetResult{Name: name}
	if revoked != nil {
		res.RevokedKey = trust.GossipKeyID(revoked)
	}
	// The forgotten node still holds the gossip key (and, like every
	// node, the CA key: it could mint itself a new identity). A rotation
	// shuts it out of gossip; every member installs the new key only once
	// it holds the revocation, so none hands the key on to it.
	if in.keys != nil && revoked != nil {
		rot, err := in.keys.Rotate(ctx, revoked)
		res.Rotation = &rot
		if err != nil {
			res.RotationError = err.Error()
			in.log.Warn("node forgotten, but the gossip key rotation that shuts it out did not finish; run 'starling keys rotate'", "node", name, "err", err)
		}
	}
	return res, nil
}

// forgetNode deletes a dead node's record, freeing its subnet and its
// name at once, and revokes the key the name was bound to (node/trust/identity.go):
// the revocation is written first, so no node frees the name without
// also refusing the old key; before it, the records the node wrote for
// the cluster are written again by this node (adoptRecords).
func (in *info) forgetNode(name string) (revoked []byte, err error) {
	rec, ok, err := in.store.Get(view.StatusKey(name))
	if err != nil || !ok || rec.Deleted {
		return nil, err
	}
	var recs []crdt.Record
	if len(rec.Signer) > 0 && !in.id.IsRevoked(rec.Signer) {
		// What the node wrote for the cluster (objects applied through
		// it, deletes, revisions, image records) would be refused, once
		// its key is revoked, by every node that does not hold it yet:
		// this node writes it again under its own key first.
		adopted, err := in.adoptRecords(rec.Signer)
		if err != nil {
			return nil, err
		}
		recs = append(recs, adopted...)
		b, err := json.Marshal(trust.Revocation{Name: name, Key: rec.Signer})
		if err != nil {
			return nil, err
		}
		recs = append(recs, crdt.Record{Key: trust.RevokedKey(rec.Signer), Value: b, Version: in.clock.Now(), Origin: in.self})
		revoked = rec.Signer
	}
	in.clock.Update(rec.Version)
	recs = append(recs, crdt.Record{Key: rec.Key, Version: in.clock.Now(), Origin: in.self, Deleted: true})
	if err := in.writer.PublishDurable(recs...); err != nil {
		return nil, err
	}
	// The forgotten node may still hold the token it joined with.
	return revoked, in.join.DeleteTokens()
}

// adoptRecords returns new versions, written by this node, of the records
// signed by key other than node statuses and join tokens (forgetNode
// deletes both): Deployments, StatefulSets and Services applied through
// the forgotten node, their revisions, image records and deletes.
func (in *info) adoptRecords(key []byte) ([]crdt.Record, error) {
	all, err := in.store.Snapshot()
	if err != nil {
		return nil, err
	}
	var out []crdt.Record
	for _, r := range all {
		kind, _, _ := strings.Cut(r.Key, "/")
		if !bytes.Equal(r.Signer, key) || kind == view.StatusKind || kind == trust.JoinTokenKind || kind == trust.RevokedKind {
			continue
		}
		in.clock.Update(r.Version)
		out = append(out, crdt.Record{Key: r.Key, Value: r.Value, Deleted: r.Deleted, Version: in.clock.Now(), Origin: in.self})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
