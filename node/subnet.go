package node

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/ipam"
)

// metaSubnet holds this node's claim (JSON ipam.Claim) across restarts.
const metaSubnet = "pod-subnet"

// subnets is this node's pod subnet: the claim (net/ipam) it makes, keeps
// across restarts and settles before any pod runs, and the pod network it
// then configures. It owns its lock.
type subnets struct {
	self         string
	fixed        string // --pod-subnet ("": claim a free /24)
	cluster      *net.IPNet
	clusterCIDR  netip.Prefix
	settle       time.Duration
	reclaimAfter time.Duration
	store        Store
	clock        *hlc.Clock
	gossip       *gossip.Cluster
	log          *slog.Logger
	// publish gossips this node's record (self.publishStatus(nil)).
	publish func()
	// use configures the pod network for the claimed subnet; nil in
	// in-process tests.
	use func(*net.IPNet) error

	mu    sync.Mutex
	claim ipam.Claim
	ready chan struct{} // closed once the claim settled and the network uses it
}

// otherClaims returns the subnet claims of other nodes that still hold
// them: alive nodes, and dead ones whose record is younger than
// SubnetReclaimAfter (a dead node stops writing, so its record's age is
// how long it has been gone). A claim whose node record is deleted
// ("starling node forget") is free.
func (sn *subnets) others() []ipam.Claim {
	recs, err := sn.store.List(statusKind + "/")
	if err != nil {
		return nil
	}
	members := map[string]gossip.MemberState{}
	for _, m := range sn.gossip.Members() {
		members[m.Name] = m.State
	}
	statuses := decodeStatuses(recs, sn.clusterCIDR)
	var out []ipam.Claim
	for _, r := range recs {
		s, ok := statuses[r.Origin]
		if !ok || s.Name == sn.self || s.PodSubnet == "" || statusKey(s.Name) != r.Key {
			continue
		}
		if !reserved(members[s.Name], r, sn.reclaimAfter) {
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

// reservedFor is reserved for node name, from membership and the
// status record held.
func (sn *subnets) reservedFor(name string) bool {
	rec, ok, err := sn.store.Get(statusKey(name))
	if err != nil || !ok || rec.Deleted {
		return false
	}
	var state gossip.MemberState
	for _, m := range sn.gossip.Members() {
		if m.Name == name {
			state = m.State
		}
	}
	return reserved(state, rec, sn.reclaimAfter)
}

// current is the claim this node holds (zero before it claimed).
func (sn *subnets) current() ipam.Claim {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	return sn.claim
}

// set holds c as this node's claim; persist keeps it across restarts.
func (sn *subnets) set(c ipam.Claim, persist bool) {
	sn.mu.Lock()
	sn.claim = c
	sn.mu.Unlock()
	if !persist {
		return
	}
	if b, err := json.Marshal(c); err == nil {
		if err := sn.store.PutMeta(metaSubnet, b); err != nil {
			sn.log.Warn("persist subnet claim", "err", err)
		}
	}
}

// isReady reports whether the claim settled and pods may run on it.
func (sn *subnets) isReady() bool {
	select {
	case <-sn.ready:
		return true
	default:
		return false
	}
}

// kept is the claim this node persisted in an earlier run (zero if none).
func (sn *subnets) kept() ipam.Claim {
	var claim ipam.Claim
	if b, ok, err := sn.store.GetMeta(metaSubnet); err == nil && ok {
		json.Unmarshal(b, &claim)
	}
	return claim
}

// claimSubnet gives the node its pod subnet before any pod runs, and
// reports false if ctx ended first. With --pod-subnet the choice is the
// operator's. Otherwise the node keeps the subnet it claimed before (kept
// in badger) unless another node's claim beats it, or picks a free /24;
// it publishes the claim and waits SubnetSettle; if a winning claim for
// the same subnet appeared meanwhile it picks again.
func (sn *subnets) claimSubnet(ctx context.Context) bool {
	claim := sn.kept()
	// A claim kept from an earlier run has stood already: no settle wait.
	settled := claim.Subnet != ""
	if sn.fixed != "" && claim.Subnet != sn.fixed {
		claim = ipam.Claim{Node: sn.self, Subnet: sn.fixed, Since: sn.clock.Now()}
		settled = false
	}
	for {
		others := sn.others()
		if who, lost := ipam.Lost(claim, others); claim.Subnet == "" || lost && sn.fixed == "" {
			if lost {
				sn.log.Warn("subnet claimed earlier by another node; picking another", "subnet", claim.Subnet, "winner", who)
			}
			sub, err := ipam.Pick(sn.cluster, sn.self, ipam.Taken(others))
			if err != nil {
				sn.log.Error("cannot claim a pod subnet", "err", err)
				select {
				case <-ctx.Done():
					return false
				case <-time.After(10 * time.Second):
				}
				continue
			}
			claim = ipam.Claim{Node: sn.self, Subnet: sub.String(), Since: sn.clock.Now()}
			settled = false
		} else if lost {
			sn.log.Error("--pod-subnet is claimed earlier by another node; fix the flag on one of them", "subnet", claim.Subnet, "winner", who)
		}
		claim.Node = sn.self
		sn.set(claim, true)
		if settled {
			break
		}
		sn.publish()
		select {
		case <-ctx.Done():
			return false
		case <-time.After(sn.settle):
		}
		if _, lost := ipam.Lost(claim, sn.others()); !lost || sn.fixed != "" {
			break
		}
	}
	_, subnet, _ := net.ParseCIDR(claim.Subnet)
	if sn.use != nil {
		if err := sn.use(subnet); err != nil {
			sn.log.Error("configure the pod network", "subnet", claim.Subnet, "err", err)
			return false
		}
	}
	close(sn.ready)
	sn.log.Info("pod subnet claimed", "subnet", claim.Subnet, "since", claim.Since)
	return true
}
