package node

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/net/ipam"
)

// metaSubnet holds this node's claim (JSON ipam.Claim) across restarts.
const metaSubnet = "pod-subnet"

// otherClaims returns the subnet claims of other nodes that still hold
// them: alive nodes, and dead ones whose record is younger than
// SubnetReclaimAfter (a dead node stops writing, so its record's age is
// how long it has been gone). A claim whose node record is deleted
// ("starling node forget") is free.
func (a *Agent) otherClaims() []ipam.Claim {
	recs, err := a.store.List(statusKind + "/")
	if err != nil {
		return nil
	}
	members := map[string]gossip.MemberState{}
	for _, m := range a.cluster.Members() {
		members[m.Name] = m.State
	}
	statuses := decodeStatuses(recs, a.clusterCIDR)
	var out []ipam.Claim
	for _, r := range recs {
		s, ok := statuses[r.Origin]
		if !ok || s.Name == a.cfg.Name || s.PodSubnet == "" || statusKey(s.Name) != r.Key {
			continue
		}
		if !reserved(members[s.Name], r, a.cfg.SubnetReclaimAfter) {
			continue
		}
		out = append(out, ipam.Claim{Node: s.Name, Subnet: s.PodSubnet, Since: s.SubnetSince})
	}
	return out
}

// reserved reports whether the subnet claim in status record r still
// holds, its node being in membership state state: a live node's does, a
// down one's for reclaimAfter after its last write (a dead node stops
// writing, so its record's age is how long it has been gone).
func reserved(state gossip.MemberState, r crdt.Record, reclaimAfter time.Duration) bool {
	return state.Up() || time.Since(time.Unix(0, r.Version.Wall)) <= reclaimAfter
}

// claimReserved is reserved for node name, from membership and the
// status record held.
func (a *Agent) claimReserved(name string) bool {
	rec, ok, err := a.store.Get(statusKey(name))
	if err != nil || !ok || rec.Deleted {
		return false
	}
	var state gossip.MemberState
	for _, m := range a.cluster.Members() {
		if m.Name == name {
			state = m.State
		}
	}
	return reserved(state, rec, a.cfg.SubnetReclaimAfter)
}

func (a *Agent) currentClaim() ipam.Claim {
	a.subnetMu.Lock()
	defer a.subnetMu.Unlock()
	return a.subnet
}

func (a *Agent) setClaim(c ipam.Claim) {
	a.subnetMu.Lock()
	a.subnet = c
	a.subnetMu.Unlock()
	if b, err := json.Marshal(c); err == nil {
		if err := a.store.PutMeta(metaSubnet, b); err != nil {
			a.log.Warn("persist subnet claim", "err", err)
		}
	}
}

func (a *Agent) subnetIsReady() bool {
	select {
	case <-a.subnetReady:
		return true
	default:
		return false
	}
}

// claimSubnet gives the node its pod subnet before any pod runs, and
// reports false if ctx ended first. With --pod-subnet the choice is the
// operator's. Otherwise the node keeps the subnet it claimed before (kept
// in badger) unless another node's claim beats it, or picks a free /24;
// it publishes the claim and waits SubnetSettle; if a winning claim for
// the same subnet appeared meanwhile it picks again.
func (a *Agent) claimSubnet(ctx context.Context) bool {
	var claim ipam.Claim
	if b, ok, err := a.store.GetMeta(metaSubnet); err == nil && ok {
		json.Unmarshal(b, &claim)
	}
	// A claim kept from an earlier run has stood already: no settle wait.
	settled := claim.Subnet != ""
	if a.cfg.PodSubnet != "" && claim.Subnet != a.cfg.PodSubnet {
		claim = ipam.Claim{Node: a.cfg.Name, Subnet: a.cfg.PodSubnet, Since: a.clock.Now()}
		settled = false
	}
	_, cluster, _ := net.ParseCIDR(a.cfg.ClusterCIDR)
	for {
		others := a.otherClaims()
		if who, lost := ipam.Lost(claim, others); claim.Subnet == "" || lost && a.cfg.PodSubnet == "" {
			if lost {
				a.log.Warn("subnet claimed earlier by another node; picking another", "subnet", claim.Subnet, "winner", who)
			}
			sub, err := ipam.Pick(cluster, a.cfg.Name, ipam.Taken(others))
			if err != nil {
				a.log.Error("cannot claim a pod subnet", "err", err)
				select {
				case <-ctx.Done():
					return false
				case <-time.After(10 * time.Second):
				}
				continue
			}
			claim = ipam.Claim{Node: a.cfg.Name, Subnet: sub.String(), Since: a.clock.Now()}
			settled = false
		} else if lost {
			a.log.Error("--pod-subnet is claimed earlier by another node; fix the flag on one of them", "subnet", claim.Subnet, "winner", who)
		}
		claim.Node = a.cfg.Name
		a.setClaim(claim)
		if settled {
			break
		}
		a.publishStatus(nil)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(a.cfg.SubnetSettle):
		}
		if _, lost := ipam.Lost(claim, a.otherClaims()); !lost || a.cfg.PodSubnet != "" {
			break
		}
	}
	_, subnet, _ := net.ParseCIDR(claim.Subnet)
	if a.useSubnet != nil {
		if err := a.useSubnet(subnet); err != nil {
			a.log.Error("configure the pod network", "subnet", claim.Subnet, "err", err)
			return false
		}
	}
	close(a.subnetReady)
	a.log.Info("pod subnet claimed", "subnet", claim.Subnet, "since", claim.Since)
	a.lastStatus = "" // republish with SubnetReady
	return true
}

// forgetNode deletes a dead node's record, freeing its subnet and its
// name at once, and revokes the key the name was bound to (identity.go):
// the revocation is written first, so no node frees the name without
// also refusing the old key; before it, the records the node wrote for
// the cluster are written again by this node (adoptRecords).
func (a *Agent) forgetNode(name string) (revoked []byte, err error) {
	rec, ok, err := a.store.Get(statusKey(name))
	if err != nil || !ok || rec.Deleted {
		return nil, err
	}
	var recs []crdt.Record
	if len(rec.Signer) > 0 && !a.id.isRevoked(rec.Signer) {
		// What the node wrote for the cluster (objects applied through
		// it, deletes, revisions, image records) would be refused, once
		// its key is revoked, by every node that does not hold it yet:
		// this node writes it again under its own key first.
		adopted, err := a.adoptRecords(rec.Signer)
		if err != nil {
			return nil, err
		}
		recs = append(recs, adopted...)
		b, err := json.Marshal(revocation{Name: name, Key: rec.Signer})
		if err != nil {
			return nil, err
		}
		recs = append(recs, crdt.Record{Key: revokedKey(rec.Signer), Value: b, Version: a.clock.Now(), Origin: a.cfg.Name})
		revoked = rec.Signer
	}
	a.clock.Update(rec.Version)
	recs = append(recs, crdt.Record{Key: rec.Key, Version: a.clock.Now(), Origin: a.cfg.Name, Deleted: true})
	if err := a.publish(recs...); err != nil {
		return nil, err
	}
	// The forgotten node may still hold the token it joined with.
	return revoked, a.join.deleteTokens()
}

// adoptRecords returns new versions, written by this node, of the records
// signed by key other than node statuses and join tokens (forgetNode
// deletes both): Deployments, StatefulSets and Services applied through
// the forgotten node, their revisions, image records and deletes.
func (a *Agent) adoptRecords(key []byte) ([]crdt.Record, error) {
	all, err := a.store.Snapshot()
	if err != nil {
		return nil, err
	}
	var out []crdt.Record
	for _, r := range all {
		kind, _, _ := strings.Cut(r.Key, "/")
		if !bytes.Equal(r.Signer, key) || kind == statusKind || kind == joinTokenKind || kind == revokedKind {
			continue
		}
		a.clock.Update(r.Version)
		out = append(out, crdt.Record{Key: r.Key, Value: r.Value, Deleted: r.Deleted, Version: a.clock.Now(), Origin: a.cfg.Name})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// heldStatus is the node status this node holds for name.
func (a *Agent) heldStatus(name string) (NodeStatus, bool) {
	rec, ok, err := a.store.Get(statusKey(name))
	if err != nil || !ok {
		return NodeStatus{}, false
	}
	s, ok := decodeStatuses([]crdt.Record{rec}, a.clusterCIDR)[name]
	return s, ok
}

// heldStatuses are the node statuses this node holds, by name.
func (a *Agent) heldStatuses() map[string]NodeStatus {
	recs, err := a.store.List(statusKind + "/")
	if err != nil {
		return nil
	}
	return decodeStatuses(recs, a.clusterCIDR)
}
