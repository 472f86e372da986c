package node

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/ipam"
	"github.com/starling-orchestrator/starling/node/view"
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
	// republish asks for this node's record to be published again (a
	// subnet claim or a volume binding changed): the agent's loop reads
	// it (self.republish).
	republish chan struct{}
	// use configures the pod network for the claimed subnet
	// (podnet.Network.SetSubnet, with the host rules); nil in in-process tests and dry runs.
	use func(*net.IPNet) error

	// claims are the held statuses' subnet claims as of the latest view,
	// the input of the check for a displaced claim (subnetmove.go).
	claims *view.ClaimsFeed

	// settled: the claim settled and the pod network uses it; false
	// while a displaced claim moves (subnetmove.go).
	settled atomic.Bool

	mu    sync.Mutex
	claim ipam.Claim
	ready chan struct{} // closed once the first claim settled and the network uses it
	// rivals are settled claims that beat this node's, from records this
	// node refused (noteRival), by node. refused is where the arrival
	// check leaves the claims it refused as takeovers (rejects.refused),
	// read by the check of this node's settled claim.
	rivals  map[string]ipam.Claim
	refused chan ipam.Claim
	// askers holds, by subnet, the first node that asked this node to
	// confirm a claim on it (see answerClaim).
	askers *askers
	// lastCheck is the last step of this node's claim check, for
	// diagnostics (the scale simulation prints it for subnets settled
	// twice).
	lastCheck atomic.Value // string
}

// others returns the subnet claims of other nodes that still hold
// them: alive nodes, and dead ones whose record is younger than
// SubnetReclaimAfter (a dead node stops writing, so its record's age is
// how long it has been gone). A claim whose node record is deleted
// ("starling node forget") is free.
func (sn *subnets) others() []ipam.Claim {
	claims := sn.claims.Load()
	var out []ipam.Claim
	claims.Each(func(s view.NodeStatus) {
		if s.Name == sn.self || s.PodSubnet == "" || !claims.Reserved(s.Name, sn.reclaimAfter) {
			return
		}
		out = append(out, ipam.Claim{Node: s.Name, Subnet: s.PodSubnet, Since: s.SubnetSince, Settled: s.SubnetReady})
	})
	slices.SortFunc(out, func(a, b ipam.Claim) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// publish asks for this node's record to be published again, with the
// claim as it is now (coalesced).
func (sn *subnets) publish() {
	select {
	case sn.republish <- struct{}{}:
	default:
	}
}

// Own is this node's pod subnet (invalid before it claimed one): what
// the routes controller routes locally (dataplane.Subnet).
func (sn *subnets) Own() netip.Prefix {
	p, _ := netip.ParsePrefix(sn.current().Subnet)
	return p
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
// in badger) unless another node's claim beats it, or picks a free /24
// (settleClaim); then, for as long as it runs, it moves to another subnet
// if an earlier settled claim displaces its own (keepClaim).
func (sn *subnets) claimSubnet(ctx context.Context) bool {
	claim := sn.kept()
	// A claim kept from an earlier run has stood already: no settle wait.
	settled := claim.Subnet != ""
	// Every record this node writes is stamped after its claim, also when
	// the wall clock stepped back since: peers read a claim dated after
	// its record as made at the record's write (view.CapTimes).
	sn.clock.Update(claim.Since) // (a claim over hlc.MaxOffset ahead leaves the clock as it was)
	if sn.fixed != "" && claim.Subnet != sn.fixed {
		claim = ipam.Claim{Node: sn.self, Subnet: sn.fixed, Since: sn.clock.Now()}
		settled = false
	}
	claim, ok := sn.settleClaim(ctx, claim, settled, map[string]bool{})
	if !ok || !sn.useClaim(claim) {
		return false
	}
	close(sn.ready)
	if sn.fixed == "" {
		go sn.keepClaim(ctx, claim)
	}
	return true
}

// settleClaim settles claim (zero: none yet) and returns it, or reports
// false if ctx ended first: it keeps claim unless another node's claim
// beats it or it is in avoid (subnets peers said another node holds),
// else picks a free /24; it publishes the claim and waits SubnetSettle,
// then checks it with the subnet's arbiters (confirm); if a winning claim
// for the same subnet appeared meanwhile it picks again. A claim that
// stood already (settled: kept from an earlier run) is kept at once
// unless an earlier claim beats it.
func (sn *subnets) settleClaim(ctx context.Context, claim ipam.Claim, settled bool, avoid map[string]bool) (ipam.Claim, bool) {
	for {
		others := sn.others()
		// A claim that stood (kept from an earlier run) loses only to an
		// earlier one; a new one also yields to any settled claim, which
		// peers would not let it take (ipam.Yields).
		lose := ipam.Yields
		if settled {
			lose = ipam.Lost
		}
		if who, lost := lose(claim, others); claim.Subnet == "" || avoid[claim.Subnet] || lost && sn.fixed == "" {
			if lost {
				sn.log.Warn("subnet claimed earlier, or settled, by another node; picking another", "subnet", claim.Subnet, "winner", who)
			}
			taken := ipam.Taken(others)
			for s := range avoid {
				taken[s] = true
			}
			sub, err := ipam.Pick(sn.cluster, sn.self, taken)
			if err != nil {
				sn.log.Error("cannot claim a pod subnet", "err", err)
				select {
				case <-ctx.Done():
					return ipam.Claim{}, false
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
			return claim, true
		}
		sn.publish()
		select {
		case <-ctx.Done():
			return ipam.Claim{}, false
		case <-time.After(sn.settle):
		}
		if sn.fixed != "" {
			return claim, true
		}
		if _, lost := ipam.Yields(claim, sn.others()); !lost {
			who, ok := sn.confirm(ctx, claim)
			if ok {
				return claim, true
			}
			if who != "" {
				sn.log.Warn("peers hold another node's claim on the subnet this node claimed; picking another", "subnet", claim.Subnet, "holder", who)
				avoid[claim.Subnet] = true
			}
		}
	}
}

// useClaim configures the pod network for a settled claim and marks it
// ready for pods; false when the network could not be configured.
func (sn *subnets) useClaim(claim ipam.Claim) bool {
	_, subnet, _ := net.ParseCIDR(claim.Subnet)
	if sn.use != nil {
		if err := sn.use(subnet); err != nil {
			sn.log.Error("configure the pod network", "subnet", claim.Subnet, "err", err)
			return false
		}
	}
	sn.settled.Store(true)
	sn.log.Info("pod subnet claimed", "subnet", claim.Subnet, "since", claim.Since)
	return true
}

// overlaps reports whether two subnets share an address.
func overlaps(a, b string) bool {
	pa, errA := netip.ParsePrefix(a)
	pb, errB := netip.ParsePrefix(b)
	return errA == nil && errB == nil && pa.Overlaps(pb)
}
