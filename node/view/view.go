package view

import (
	"slices"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/placement"
)

// View is one consistent, immutable reading of the cluster as this node
// sees it (snapshot.go builds it): live members, node records, desired
// objects decoded once, every desired replica and where placement puts
// it, the Services' allocation and endpoints. Its maps and slices are
// shared by every reader: never modify them.
type View struct {
	built time.Time
	// Synced: the node held the cluster's state (Damping.IsSynced) when
	// this view was built. The reconcile loop acts only on such views.
	Synced bool
	// Members is the membership as gossip gave it (routes follow it,
	// without flap damping); alive the members that count for placement
	// (Damping.AliveAfter).
	Members []gossip.Member
	Alive   map[string]bool
	// aliveFrom is alive with what it was computed from (members.AliveAfter).
	aliveFrom Alive
	Statuses  map[string]NodeStatus
	// claims indexes the held statuses' subnet claims (ClaimsFeed).
	claims *Claims
	// OldSelf is this node's name while its held record is of an
	// earlier run of its agent (it restarted and has not published
	// yet), else "": StaleRecords judges only the other nodes'.
	OldSelf string
	// Winners are the nodes whose subnet claim wins (WinningClaims): the
	// only ones eligible, routed and taken as endpoints.
	Winners map[string]bool
	// claimWinners are the winners by claims alone (ipam.Winners);
	// winners adds those whose only rivals no longer hold their claims
	// (reclaimedWinners), recomputed on every derive.
	claimWinners map[string]bool
	// reclaimAt is when the first reservation that beat a claim
	// expires (reclaimedWinners): zero when none did.
	reclaimAt time.Time
	// settleAt is when the first node its record leaves out of
	// placement counts again (SettlingOut): zero when none is.
	settleAt  time.Time
	Workloads []manifest.Object // Deployments and StatefulSets
	All       []DesiredReplica  // sorted by ID
	// plain and plainWithout are placement's (assign), before the
	// copies that run away from placement's choice (Away) are kept where
	// they run; placement is after.
	plain, plainWithout placement.Placement
	// Away are the copies the eligible nodes run of replicas placement
	// gives another node (AwayIndex.Elsewhere): placement.Keep leaves
	// them where they run.
	Away []placement.Holder
	// Stale are the live nodes whose held record an earlier run of
	// their agent wrote (StaleRecords): its copies' state is unknown.
	Stale     map[string]bool
	Placement placement.Placement
	// Owner is each desired replica's node, after leaving out the
	// excluded nodes (place; placement gives the owners before).
	Owner OwnerTable
	// given is placement's (givenSlots), for unreported; own is
	// what owner gives this node (OwnedBy). Both are computed with
	// placement.
	given given
	Own   *owned
	// Excluded are the nodes left out of placement for not listing the
	// replicas placed on them (unresponsive.go).
	Excluded map[string]bool
	// Hashes are the workloads' current spec hashes by workload key, and
	// probes the probes of their current templates (currentProbes).
	Hashes map[string]string
	Probes map[string]probe.Probes
	// Services are the Services, alloc their ClusterIPs and NodePorts,
	// SvcIndex the workloads they select, SvcPorts the dataplane input
	// by Service key (serviceview.go).
	Services []manifest.Object
	Alloc    service.Allocation
	SvcIndex serviceIndex
	SvcPorts *portShards
	// SvcChanged are the Services whose ports differ from the previous
	// view's; svcAll: this is the first view with ports.
	SvcChanged []string
	svcAll     bool
	// lbChanged: the LoadBalancer addresses of v.Alloc differ from the
	// previous view's (lbInto).
	lbChanged bool
	// objectsKey and placementKey identify the inputs the desired
	// objects and placement were computed from: a rebuild whose inputs
	// are unchanged reuses them.
	objectsKey, placementKey string
	// Eligible are the nodes placement may use; unlisted the nodes that
	// do not list the replicas placed on them (unreported).
	Eligible []placement.Node
	unlisted map[string]bool
	// workloadsKey and nodesKey are placement's workload and node inputs
	// (viewkeys.go), kept with the inputs they identify.
	workloadsKey, nodesKey string
	// Changes is what differs from the view built before this one.
	Changes Changes
	// Config is the data of the ConfigMaps and Secrets (configdata.go).
	Config *ConfigData
	// Ingresses are the Ingresses, sorted by key (ingresses.go).
	Ingresses []manifest.Object
	// ClaimObjects are the PersistentVolumeClaims; VolumeClaims them by
	// "namespace/name" with the node that holds each one's data
	// (BindClaims); pins the node each workload that mounts a bound
	// claim must run on (pinsOf), placement's input.
	ClaimObjects []manifest.Object
	VolumeClaims map[string]VolumeClaim
	// ClaimRecords are the claims ("namespace/name") whose record is
	// live, whether it decodes or not: a claim that does not decode (a
	// newer version's) is not taken for deleted.
	ClaimRecords map[string]bool
	pins         map[string]map[int]string
}

// Changes is what differs between a view and the one its builder built
// before it, from the records that changed (Builder.sync): a view whose
// inputs did not change shares what was computed from them. Every field
// is true for a first view, and after a view the builder did not build
// was stored (Builder.Set).
type Changes struct {
	// Objects: a desired object's record (Deployment, StatefulSet,
	// Service).
	Objects bool
	// Statuses: a node's status record.
	Statuses bool
	// Claims: a held status's subnet claim, or which statuses are held.
	Claims bool
	// Nodes: what placement reads of a node (claim, readiness,
	// capacity, labels); a status that lists other replicas changes
	// Statuses only.
	Nodes bool
	// Config: a ConfigMap's or Secret's record.
	Config bool
	// Ingresses: an Ingress's record.
	Ingresses bool
}

// everything is the Changes of a first view.
var everything = Changes{Objects: true, Statuses: true, Claims: true, Nodes: true, Config: true, Ingresses: true}

func (c Changes) or(d Changes) Changes {
	return Changes{Objects: c.Objects || d.Objects, Statuses: c.Statuses || d.Statuses, Claims: c.Claims || d.Claims, Nodes: c.Nodes || d.Nodes,
		Config: c.Config || d.Config, Ingresses: c.Ingresses || d.Ingresses}
}

// assign runs placement (rendezvous hashing with bounded loads, package
// placement) over the eligible nodes, and again without the excluded
// nodes when there are any (without is p when there are none).
func assign(nodes []placement.Node, objs []manifest.Object, excluded map[string]bool, pins map[string]map[int]string) (p, without placement.Placement) {
	ws := pinned(workloadsOf(objs), pins)
	p = placement.Assign(nodes, ws, placement.Options{})
	if len(excluded) == 0 {
		return p, p
	}
	kept := slices.DeleteFunc(slices.Clone(nodes), func(n placement.Node) bool { return excluded[n.Name] })
	return p, placement.Assign(kept, ws, placement.Options{})
}

// place returns assign's placements with the copies that run away
// from placement's choice (away)
// kept where they run (placement.Keep: a node that returns takes back
// only what its peers cannot keep under their load bound), p, with each
// replica's owner (replica ID -> node) after leaving out the excluded
// nodes (p gives the owners before). Nodes in excluded (they do not list
// what they are given: unresponsive.go) are left out of Deployments'
// placement only: a StatefulSet replica (at most one copy) must not move
// off a live node on this node's judgement, which others may not share
// yet, and a fenced node rightly stops listing its StatefulSet replicas.
func place(plain, plainWithout placement.Placement, nodes []placement.Node, objs []manifest.Object, all []DesiredReplica, excluded map[string]bool, away []placement.Holder,
	pins map[string]map[int]string) (p placement.Placement, owner OwnerTable) {
	ws := pinned(workloadsOf(objs), pins)
	p = placement.Keep(plain, nodes, ws, away, placement.Options{})
	owner = Owners(all, p)
	if len(excluded) == 0 {
		return p, owner
	}
	kept := slices.DeleteFunc(slices.Clone(nodes), func(n placement.Node) bool { return excluded[n.Name] })
	without := placement.Keep(plainWithout, kept, ws, away, placement.Options{})
	for i, d := range all {
		if !d.tmpl.AtMostOne {
			owner.Node[i] = without.Owner(d.key(), d.ordinal)
		}
	}
	return p, owner
}

// owned is what placement gives one node: its replicas (of the view's
// desired replicas, in ID order) and their workloads (WorkloadKey).
type owned struct {
	Node      string
	Replicas  []reconcile.Replica
	Workloads map[string]bool
}

// OwnedBy is what owner gives self of all (read by index when owner was
// built on all, by ID otherwise).
func OwnedBy(self string, all []DesiredReplica, owner OwnerTable) *owned {
	o := &owned{Node: self, Workloads: map[string]bool{}}
	aligned := len(all) == len(owner.All) && (len(all) == 0 || &all[0] == &owner.All[0])
	for i, d := range all {
		if aligned && owner.Node[i] == self || !aligned && owner.Of(d.Id) == self {
			o.Replicas = append(o.Replicas, d.Replica())
			o.Workloads[d.key()] = true
		}
	}
	return o
}

// DesiredReplica is one desired replica in compact form, 48 bytes: its
// own ID, name and ordinal, and its workload's template (expansion),
// shared. A reconcile.Replica is about 500 bytes (its Spec): a view's
// 10,000 desired replicas came to 5 MB, which 1,000 simulated agents
// could not hold; they are made whole (replica) only where a node acts
// on them.
type DesiredReplica struct {
	ReplicaRef
	tmpl *reconcile.Replica
}

// Replica is d made whole.
func (d DesiredReplica) Replica() reconcile.Replica {
	r := *d.tmpl
	r.ID, r.Name, r.Ordinal = d.Id, d.name, d.ordinal
	return r
}

// key is d's WorkloadKey.
func (d DesiredReplica) key() string { return reconcile.WorkloadKey(d.tmpl.Namespace, d.tmpl.Workload) }

// OwnedBy is what v's placement gives self (computed with placement on
// views the builder derives).
func (v *View) OwnedBy(self string) *owned {
	if v.Own != nil && v.Own.Node == self {
		return v.Own
	}
	return OwnedBy(self, v.All, v.Owner)
}

// Candidates are the desired replicas reconcile.Owned may return for
// self: those placement gives it and those of its containers (a
// make-before-break handoff keeps one); Owned passes over every other.
// O(owned + containers x log replicas), where all of them cost
// O(replicas of the cluster) on every pass.
func (v *View) Candidates(self string, observed []reconcile.Container) []reconcile.Replica {
	own := v.OwnedBy(self).Replicas
	out := slices.Clip(own)
	for _, c := range observed {
		if v.Owner.Of(c.ID) == self {
			continue // in own
		}
		if i, ok := slices.BinarySearchFunc(v.All, c.ID, func(d DesiredReplica, id string) int { return strings.Compare(d.Id, id) }); ok {
			out = append(out, v.All[i].Replica())
		}
	}
	return out
}

// Current reports whether node name counts (alive, flap damping
// included) and its held record is of its current run (not stale): what
// that record lists runs now.
func (v *View) Current(name string) bool { return v.Alive[name] && !v.Stale[name] }

// LiveReplicas is every replica copy that live nodes report in their
// status records (reported): the input of rollout.Count.
func (v *View) LiveReplicas() []api.Replica {
	var out []api.Replica
	for name := range v.Statuses {
		if v.Alive[name] {
			out = append(out, v.Reported(name)...)
		}
	}
	return out
}

// EarlierRun reports whether status s was written by a run of its
// node's agent that started before started (Started is kept to the
// second: a run started within the same second is not told apart).
func EarlierRun(s NodeStatus, started time.Time) bool {
	return !s.Started.IsZero() && s.Started.Unix() < started.Unix()
}

// StaleReason is the Reason of a copy listed in a stale record.
const StaleReason = "its node restarted and its record of the new run has not arrived"

// Reported returns the replicas node name's held record lists, as they
// count now. A stale record's copies (StaleRecords: an earlier run of
// the node's agent wrote it) are of unknown state: they are listed with
// phase Unknown, not ready (StaleReason), as placement and the rollout
// gate take them (holderOf, node/decision.go), so that get replicas and
// rollout status count what the decisions count. Callers must not
// modify the slice (a current record's own).
func (v *View) Reported(name string) []api.Replica {
	s := v.Statuses[name]
	if !v.staleRecord(name) {
		return s.Replicas
	}
	out := make([]api.Replica, len(s.Replicas))
	for i, r := range s.Replicas {
		switch r.Phase {
		case api.PhaseTerminating, api.PhasePending, api.PhaseCreateBackOff, api.PhaseConfigError:
			// Counted as it says (going, or no container), as the
			// rollout gate and placement count it.
		default:
			r.Phase, r.Reason = api.PhaseUnknown, StaleReason
		}
		r.Ready = false
		out[i] = r
	}
	return out
}

// staleRecord reports whether node name's held record is stale: an
// earlier run of its agent wrote it (StaleRecords), or it is this node's
// own of an earlier run.
func (v *View) staleRecord(name string) bool {
	return v.Stale[name] || name == v.OldSelf && name != ""
}

// Holding is the REPLICAS figure of get nodes: the copies node name's
// record lists as it counts now (reported), less those going
// (Terminating) and, in a stale record, those of unknown state.
func (v *View) Holding(name string) int {
	stale, n := v.staleRecord(name), 0
	for _, r := range v.Reported(name) {
		if r.Phase != api.PhaseTerminating && !(stale && r.Phase == api.PhaseUnknown) {
			n++
		}
	}
	return n
}

// StatefulWorkloads is the set of StatefulSet workload keys in v.
func (v *View) StatefulWorkloads() map[string]bool {
	out := map[string]bool{}
	for _, o := range v.Workloads {
		if o.Kind == manifest.KindStatefulSet {
			out[reconcile.WorkloadKey(o.Namespace, o.Name)] = true
		}
	}
	return out
}
