package view

import (
	"encoding/json"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/ipam"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/placement"
)

// StatusKind is the store kind of node status records: key
// "node/cluster/<name>". Each node is the only writer of its own record.
const StatusKind = "node"

func StatusKey(name string) string { return StatusKind + "/cluster/" + name }

// NodeStatus is a node's own replicated record: where to reach it, what it
// offers, and the status of every replica it runs.
type NodeStatus struct {
	Name string `json:"name"`
	// Advertise is the node's gossip address, "ip:port" ("ip" from
	// agents before 5329c74, and before membership lists the node when
	// --advertise gives no port). Informational: nothing dials it
	// (gossip.Cluster.Introduce).
	Advertise string `json:"advertise"`
	// API is the node's TCP API base URL ("http://ip:port"), "" when it
	// serves only its unix socket.
	API       string `json:"api,omitempty"`
	PodSubnet string `json:"podSubnet"`
	// SubnetSince is when the node claimed PodSubnet (conflicts: the
	// earlier claim wins); SubnetReady says the claim has settled and the
	// node runs pods on it.
	SubnetSince hlc.Timestamp       `json:"subnetSince"`
	SubnetReady bool                `json:"subnetReady"`
	Capacity    placement.Resources `json:"capacity"`
	Labels      map[string]string   `json:"labels,omitempty"`
	Started     time.Time           `json:"started"`
	Replicas    []api.Replica       `json:"replicas"`
	// Insecure: the node runs with --insecure and no gossip key.
	Insecure bool `json:"insecure,omitempty"`
	// DiskFull: the node's data directory is full; it refuses API writes
	// and keeps running its replicas (store.Space).
	DiskFull bool `json:"diskFull,omitempty"`
	// Cert is the node's certificate (DER, base64 in JSON), issued by the
	// cluster CA for Name and the key that signs this record; empty with
	// --insecure. Peers refuse a status without a valid one (node/verify.go).
	Cert []byte `json:"cert,omitempty"`
	// MemberSig: the node signs its membership metadata (version 3,
	// node/member), so peers take an alive message for its name, and
	// route to its subnet, only at an address it signed. False from
	// agents that predate it, whose unsigned alive messages are taken as
	// before (an upgrade in place: docs/real-hosts.md).
	MemberSig bool `json:"memberSig,omitempty"`
	// SettleUntil (UTC, zero: none) is when the node counts itself for
	// placement again after its peers held it down and may run its
	// replicas (node/selfsettle.go): until then every node leaves it out
	// (SettlingOut), as the peers that held it down do.
	SettleUntil time.Time `json:"settleUntil,omitzero"`
	// Volumes are the PersistentVolumeClaims whose data the node holds
	// or is binding (VolumeBinding).
	Volumes []VolumeBinding `json:"volumes,omitempty"`

	// subnet is PodSubnet parsed (DecodeStatuses), for the checks that
	// compare one claim with every node's.
	subnet netip.Prefix
	// Signer is the key that signed the record (DecodeStatuses): the key
	// the node's name is bound to.
	Signer []byte
	// Version is the record's version (DecodeStatuses): when the node
	// last wrote it, on its clock.
	Version hlc.Timestamp `json:"-"`
}

// SameClaim reports whether a and b make the same subnet claim.
func SameClaim(a, b NodeStatus) bool {
	return a.PodSubnet == b.PodSubnet && a.SubnetSince == b.SubnetSince
}

// samePlacement reports whether placement and the claims' resolution see
// a and b alike: the same claim, readiness, capacity and labels.
func samePlacement(a, b NodeStatus) bool {
	return SameClaim(a, b) && a.SubnetReady == b.SubnetReady && a.Capacity == b.Capacity && maps.Equal(a.Labels, b.Labels)
}

// Prefix is s's pod subnet parsed (ok false when it has none or it does
// not parse).
func (s NodeStatus) Prefix() (netip.Prefix, bool) {
	if s.subnet.IsValid() {
		return s.subnet, true
	}
	p, err := netip.ParsePrefix(s.PodSubnet)
	return p.Masked(), err == nil
}

// DecodeStatuses returns the node status records in records, by name. A
// record is taken only when it is the status of the node that wrote it,
// under its key, with a pod subnet (if any) inside cluster. Every record
// from a peer passed checkRecord on arrival, and this node's own is made
// to pass it (Config.SelfStatus); relational checks (whose claim wins, whether a
// pod address is inside its node's subnet) are made where statuses are
// used. This runs on every read of the view, so it stays cheap.
func DecodeStatuses(records []crdt.Record, cluster netip.Prefix) map[string]NodeStatus {
	out := map[string]NodeStatus{}
	for _, r := range records {
		if r.Deleted {
			continue
		}
		var s NodeStatus
		if json.Unmarshal(r.Value, &s) != nil || !finishStatus(&s, r, cluster) {
			continue
		}
		out[s.Name] = s
	}
	return out
}

// finishStatus completes s, decoded from r, as DecodeStatuses takes it:
// false when it is not the status of the node that wrote it, under its
// key, with a pod subnet (if any) inside cluster; else its times capped
// (CapTimes), its subnet parsed and its signer set.
func finishStatus(s *NodeStatus, r crdt.Record, cluster netip.Prefix) bool {
	if s.Name == "" || StatusKey(s.Name) != r.Key || r.Origin != s.Name {
		return false
	}
	if s.PodSubnet != "" {
		p, err := netip.ParsePrefix(s.PodSubnet)
		if err != nil || !InsideCluster(p, cluster) {
			return false
		}
		s.subnet = p.Masked()
	}
	CapTimes(s, r.Version)
	s.Signer, s.Version = r.Signer, r.Version
	return true
}

// CapTimes caps what s dates at version, the write of the record that
// holds it: the node's start, its subnet claim, and its replicas'
// creation, start and end. An honest writer dates nothing later (its
// times are read before its hybrid logical clock stamps the record,
// which is never behind the wall clock; a clock stepped back between the
// two is capped by the difference). A writer that dates a copy in the
// future only makes it lose to older copies (placement.Keep keeps the
// oldest), but could hold a rollout's last progress ahead of its
// progress deadline; capped, it can do so by at most how far ahead of
// the reader's clock a version may be (hlc.MaxOffset, checked on
// arrival). The cap depends on the record alone, so every node reads a
// record's times alike and placement agrees.
func CapTimes(s *NodeStatus, version hlc.Timestamp) {
	written := version.Time().UTC()
	at := func(t *time.Time) {
		if t.After(written) {
			*t = written
		}
	}
	at(&s.Started)
	if s.SubnetSince.Compare(version) > 0 {
		s.SubnetSince = version
	}
	for i := range s.Replicas {
		r := &s.Replicas[i]
		at(&r.Created)
		at(&r.Started)
		terms := []*api.Termination{r.Exit, r.LastState}
		for j := range r.Containers {
			c := &r.Containers[j]
			at(&c.Started)
			terms = append(terms, c.Exit, c.LastState)
		}
		for _, t := range terms {
			if t != nil {
				at(&t.StartedAt)
				at(&t.FinishedAt)
			}
		}
	}
}

// WinningClaims returns the names of the nodes in statuses whose subnet
// claim is the winning one for its subnet (ipam.Lost), the only nodes
// whose subnet is routed and whose pod addresses become endpoints.
func WinningClaims(statuses map[string]NodeStatus) map[string]bool {
	var claims []ipam.Claim
	for _, s := range statuses {
		if s.PodSubnet != "" {
			claims = append(claims, ipam.Claim{Node: s.Name, Subnet: s.PodSubnet, Since: s.SubnetSince})
		}
	}
	return ipam.Winners(claims)
}

// eligibleNodes returns the placement input: live members whose record
// says their subnet claim has settled, sorted by name. Of two nodes
// claiming one subnet only the winner is eligible.
func eligibleNodes(alive map[string]bool, statuses map[string]NodeStatus, winners map[string]bool) []placement.Node {
	var nodes []placement.Node
	for name, s := range statuses {
		if !alive[name] || !s.SubnetReady || !winners[name] {
			continue
		}
		nodes = append(nodes, placement.Node{Name: name, Labels: s.Labels, Allocatable: s.Capacity})
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	return nodes
}

// SettlingOut returns alive without the nodes other than self whose
// record says they leave themselves out of placement at now
// (NodeStatus.SettleUntil), and the earliest time one of them counts
// again (zero: none is left out). A record's SettleUntil is taken at
// most maxSettle (--rejoin-settle) after the record was written (its
// version's wall clock): the record is the node's word about itself
// alone, and a wrong clock or a bad peer then delays its own placement
// by at most one settle. alive itself is returned when no node is left
// out; it is never modified. O(alive).
//
// Without it, a node back from down whose peers disagree (one held it
// dead and replaced its replicas, the other only suspected it) was left
// out by the one and counted by the other: the other placed its
// replicas on it while it ran none, and its copies ran beside their
// replacements until the settle ended (issue 39, TestNodeBackAtANewAddress).
func SettlingOut(alive map[string]bool, statuses map[string]NodeStatus, self string, now time.Time, maxSettle time.Duration) (map[string]bool, time.Time) {
	out, next := alive, time.Time{}
	for name, s := range statuses {
		if name == self || !alive[name] || s.SettleUntil.IsZero() {
			continue
		}
		until := SettleEnd(s, maxSettle)
		if !now.Before(until) {
			continue
		}
		if len(out) == len(alive) && out[name] {
			out = maps.Clone(alive)
		}
		delete(out, name)
		if next.IsZero() || until.Before(next) {
			next = until
		}
	}
	return out, next
}

// SettleEnd is when node s counts again after settling itself out:
// its record's SettleUntil, but at most maxSettle after the record was
// written (its version's wall clock); see SettlingOut.
func SettleEnd(s NodeStatus, maxSettle time.Duration) time.Time {
	if limit := time.Unix(0, s.Version.Wall).Add(maxSettle); s.SettleUntil.After(limit) {
		return limit
	}
	return s.SettleUntil
}

// workloadsOf turns Deployments and StatefulSets into placement workloads.
func workloadsOf(objs []manifest.Object) []placement.Workload {
	var ws []placement.Workload
	for _, o := range objs {
		if !o.IsWorkload() {
			continue
		}
		cpu, memory := podRequests(specOf(o))
		ws = append(ws, placement.Workload{
			Key:          reconcile.WorkloadKey(o.Namespace, o.Name),
			Replicas:     o.Replicas(),
			Requests:     placement.Resources{MilliCPU: cpu, MemoryBytes: memory},
			NodeSelector: o.PodTemplate().Spec.NodeSelector,
		})
	}
	return ws
}

// OwnerTable is the node of each desired replica ("" when it fits
// nowhere), aligned with the view's desired replicas (sorted by ID): a
// slice of names where a map by ID cost about 70 bytes a replica, 0.7 MB
// a view at 10,000 replicas. Read only once built.
type OwnerTable struct {
	All  []DesiredReplica
	Node []string
}

// Of is the node of the replica of ID id ("" when none: not desired, or
// placed nowhere). O(log replicas).
func (o OwnerTable) Of(id string) string {
	if i, ok := slices.BinarySearchFunc(o.All, id, func(d DesiredReplica, id string) int { return strings.Compare(d.Id, id) }); ok {
		return o.Node[i]
	}
	return ""
}

// Owners is the node p places each of all on.
func Owners(all []DesiredReplica, p placement.Placement) OwnerTable {
	out := OwnerTable{All: all, Node: make([]string, len(all))}
	for i, d := range all {
		out.Node[i] = p.Owner(d.key(), d.ordinal)
	}
	return out
}

// ReadyAtOwner lists, of the containers observed on this node, the IDs
// whose placed owner, another node whose record is current (counts: alive
// and written by its current run, view.current), reports its own copy
// Running and ready (a record an earlier run wrote lists copies that may
// have died with it: stopping this node's copy for one of those would
// leave the replica running nowhere): what make-before-break waits for (reconcile.Owned asks only
// about replicas this node runs). Another old copy being ready does not
// count: two old owners must not both let go before the new one is up.
// It reads the owners' records of this node's containers only, so a pass
// costs O(its containers x replicas a node), not O(every replica of the
// cluster).
func ReadyAtOwner(self string, counts func(string) bool, statuses map[string]NodeStatus, owner func(id string) string, observed []reconcile.Container) map[string]bool {
	out := map[string]bool{}
	for _, c := range observed {
		node := owner(c.ID)
		if node == "" || node == self || !counts(node) || out[c.ID] {
			continue
		}
		for _, r := range statuses[node].Replicas {
			if r.Ready && r.Phase == api.PhaseRunning && reconcile.ContainerID(r.Namespace, r.Name) == c.ID {
				out[c.ID] = true
				break
			}
		}
	}
	return out
}

// PrefixOf converts a parsed IPv4 network to a netip.Prefix (the zero
// Prefix for nil).
func PrefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	addr, ok := netip.AddrFromSlice(n.IP.To4())
	if !ok {
		return netip.Prefix{}
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addr, ones).Masked()
}

// HostIP is the node's address without its gossip port (a pod's
// status.hostIP); "" when Advertise does not parse.
func (s NodeStatus) HostIP() string {
	if ap, err := netip.ParseAddrPort(s.Advertise); err == nil {
		return ap.Addr().String()
	}
	if a, err := netip.ParseAddr(s.Advertise); err == nil {
		return a.String()
	}
	return ""
}
