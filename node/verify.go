package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/ipam"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/rollout"
)

// Every record a peer sends is untrusted input, like an API body: it is
// parsed into typed values and checked against what its writer may say
// before it is stored, forwarded or acted on (checkRecord, the gossip
// layer's Accept hook). Where statuses are read (decodeStatuses) the
// writer, key and subnet range are checked again, cheaply; what depends on
// the rest of the cluster (whose claim wins, whether a pod address lies in
// its node's subnet) is checked where it is used.

// Reasons a record is refused: the values of the label "reason" of
// starling_rejected_records_total.
const (
	rejectMalformed   = "malformed"    // the value does not decode as its kind
	rejectKey         = "key"          // unknown kind, or the key does not match the object
	rejectOrigin      = "origin"       // a node's own record written by another node
	rejectName        = "name"         // a name that is not a Kubernetes name
	rejectText        = "text"         // control characters, invalid UTF-8 or an oversized string
	rejectSubnet      = "subnet"       // a pod subnet outside --cluster-cidr, or not a network
	rejectPodIP       = "pod-ip"       // a replica address outside its node's pod subnet
	rejectAddress     = "address"      // an advertise or API address that does not parse
	rejectRange       = "range"        // a number out of its range (capacity, ordinal, restarts)
	rejectObject      = "object"       // a desired-state object that fails validation
	rejectTombstone   = "tombstone"    // a delete that carries a value
	rejectTooMany     = "too-many"     // more replicas than one node may report
	rejectPhase       = "phase"        // an unknown replica phase
	rejectSpecHash    = "spec-hash"    // a spec hash that is not 8 to 64 hex digits
	rejectLabels      = "labels"       // node labels that are not Kubernetes labels
	rejectClock       = "clock"        // a version more than hlc.MaxOffset ahead of this node's clock
	rejectUnsigned    = "unsigned"     // a record without a signature
	rejectSignature   = "signature"    // a signature that does not verify
	rejectIdentity    = "identity"     // signed by a key other than the one the writer's name is bound to
	rejectRevoked     = "revoked"      // signed by a key that 'starling node forget' revoked
	rejectCert        = "cert"         // a node status without a certificate the cluster CA issued for it
	rejectSubnetTaken = "subnet-taken" // a new claim that would take a live node's settled subnet
)

// Bounds of what a node may say of itself.
const (
	maxReasonLen    = 4096           // bytes of a replica's Reason
	maxNodeReplicas = 4096           // replicas one node record may list
	maxMilliCPU     = 1 << 20 * 1000 // a million cores: no real node shows more
	maxMemoryBytes  = 1 << 50        // 1 PiB
)

// rejection is why a record was refused: a reason (a metric label) and a
// message for the log.
type rejection struct {
	reason string
	err    error
}

func (r *rejection) Error() string { return r.reason + ": " + r.err.Error() }

func reject(reason, format string, args ...any) *rejection {
	return &rejection{reason: reason, err: fmt.Errorf(format, args...)}
}

// replicaPhases are the phases a node may report (api.Replica.Phase).
var replicaPhases = map[api.Phase]bool{
	api.PhasePending: true, api.PhaseContainerCreating: true, api.PhaseCreateBackOff: true, api.PhaseRunning: true,
	api.PhaseCrashLoopBackOff: true, api.PhaseExited: true, api.PhaseTerminating: true, api.PhaseUnknown: true,
}

// terminationReasons are the reasons a run may have ended
// (api.Termination.Reason).
var terminationReasons = map[string]bool{"Completed": true, "Error": true, "OOMKilled": true}

// checkRecord decides whether a record received from a peer may be stored:
// it must be a kind this node knows, its value must decode as that kind
// and pass the kind's validation, its key must name what its value holds,
// and a node's own record must be written by that node and say only what
// a node may say of itself (checkStatus). cluster is --cluster-cidr.
//
// Records are checked one by one, with no other state: a check that
// needs the rest of the cluster (is this subnet another node's?) is made
// where the records are used.
func checkRecord(r crdt.Record, cluster netip.Prefix) *rejection {
	return checkRecordWith(r, cluster, nil)
}

// checkRecordWith is checkRecord with more checks of a node's status
// (rejects.checkStatus: its certificate, its subnet claim against the
// claims held), run once the status decodes and passes checkStatus.
func checkRecordWith(r crdt.Record, cluster netip.Prefix, more func(NodeStatus, crdt.Record) *rejection) *rejection {
	kind, _, _ := strings.Cut(r.Key, "/")
	if r.Deleted {
		if len(r.Value) > 0 {
			return reject(rejectTombstone, "%s: a delete with a %d-byte value", r.Key, len(r.Value))
		}
		switch kind {
		case statusKind, imageKind, revokedKind, joinTokenKind, rollout.Kind, strings.ToLower(manifest.KindDeployment), strings.ToLower(manifest.KindStatefulSet), strings.ToLower(manifest.KindService):
			return nil
		}
		return reject(rejectKey, "unknown kind %q in key %q", kind, r.Key)
	}
	switch kind {
	case statusKind:
		var s NodeStatus
		// Unknown fields are ignored (a newer node may add some); what
		// this node reads is checked.
		if err := json.Unmarshal(r.Value, &s); err != nil {
			return reject(rejectMalformed, "%s: %v", r.Key, err)
		}
		if statusKey(s.Name) != r.Key {
			return reject(rejectKey, "record %q holds the status of node %q", r.Key, s.Name)
		}
		if r.Origin != s.Name {
			return reject(rejectOrigin, "status of node %q written by %q: a node writes only its own status", s.Name, r.Origin)
		}
		if rj := checkStatus(s, cluster); rj != nil || more == nil {
			return rj
		}
		return more(s, r)
	case imageKind:
		return checkImage(r.Key, r.Value)
	case revokedKind:
		return checkRevocation(r.Key, r.Value)
	case joinTokenKind:
		return checkJoinToken(r.Key, r.Value)
	case rollout.Kind:
		rev, err := rollout.Decode(r.Value)
		if err != nil {
			return reject(rejectMalformed, "%s: %v", r.Key, err)
		}
		if err := apiserver.CheckRef(rev.Namespace, rev.Deployment); err != nil {
			return reject(rejectName, "%s: %v", r.Key, err)
		}
		if !isHex(rev.SpecHash) {
			return reject(rejectSpecHash, "%s: spec hash %q", r.Key, rev.SpecHash)
		}
		if rollout.Key(rev.Namespace, rev.Deployment, rev.SpecHash) != r.Key {
			return reject(rejectKey, "record %q holds revision %s of %s/%s", r.Key, rev.SpecHash, rev.Namespace, rev.Deployment)
		}
		if err := checkText(rev.ChangeCause, 64<<10); err != nil {
			return reject(rejectText, "%s: changeCause: %v", r.Key, err)
		}
		// The template is what an undo brings back: it must be one a
		// Deployment may hold.
		d := appsv1.Deployment{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: manifest.KindDeployment},
			ObjectMeta: metav1.ObjectMeta{Name: rev.Deployment, Namespace: rev.Namespace},
			Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: rev.Template.Labels},
				Template: rev.Template},
		}
		b, err := json.Marshal(d)
		if err != nil {
			return reject(rejectMalformed, "%s: %v", r.Key, err)
		}
		if _, err := manifest.Decode(b); err != nil {
			return reject(rejectObject, "%s: template: %v", r.Key, oneLine(err.Error()))
		}
		return nil
	case strings.ToLower(manifest.KindDeployment), strings.ToLower(manifest.KindStatefulSet), strings.ToLower(manifest.KindService):
		o, err := manifest.Decode(r.Value)
		if err != nil {
			return reject(rejectObject, "%s: %v", r.Key, oneLine(err.Error()))
		}
		if o.Key() != r.Key {
			return reject(rejectKey, "record %q holds %s", r.Key, o.Key())
		}
		return nil
	}
	return reject(rejectKey, "unknown kind %q in key %q", kind, r.Key)
}

// checkStatus checks what a node says of itself: its name and labels are
// Kubernetes names, its addresses parse, its pod subnet is a network
// inside --cluster-cidr (between the cluster's size and a /28, as
// --pod-subnet allows), capacity is within what a machine can have, and
// every replica it lists has Kubernetes names, a known phase, and an
// address inside the node's own pod subnet.
func checkStatus(s NodeStatus, cluster netip.Prefix) *rejection {
	if errs := validation.IsDNS1123Label(s.Name); len(errs) > 0 {
		return reject(rejectName, "node name %q: %s", s.Name, strings.Join(errs, "; "))
	}
	if s.Advertise != "" {
		if _, err := netip.ParseAddr(s.Advertise); err != nil {
			if _, err := netip.ParseAddrPort(s.Advertise); err != nil {
				return reject(rejectAddress, "node %s: advertise %q: want IP or IP:PORT", s.Name, s.Advertise)
			}
		}
	}
	if s.API != "" {
		u, err := url.Parse(s.API)
		if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Path != "" || u.RawQuery != "" || u.User != nil {
			return reject(rejectAddress, "node %s: api %q: want http(s)://IP:PORT", s.Name, s.API)
		}
		if _, err := netip.ParseAddrPort(u.Host); err != nil {
			return reject(rejectAddress, "node %s: api %q: %v", s.Name, s.API, err)
		}
	}
	var subnet netip.Prefix
	if s.PodSubnet != "" {
		p, err := netip.ParsePrefix(s.PodSubnet)
		if err != nil {
			return reject(rejectSubnet, "node %s: pod subnet %q: %v", s.Name, s.PodSubnet, err)
		}
		if !insideCluster(p, cluster) {
			return reject(rejectSubnet, "node %s: pod subnet %s is not a network of /%d to /28 inside --cluster-cidr %s", s.Name, p, cluster.Bits()+1, cluster)
		}
		subnet = p
	} else if s.SubnetReady {
		return reject(rejectSubnet, "node %s: ready with no pod subnet", s.Name)
	}
	if s.Capacity.MilliCPU < 0 || s.Capacity.MilliCPU > maxMilliCPU || s.Capacity.MemoryBytes < 0 || s.Capacity.MemoryBytes > maxMemoryBytes {
		return reject(rejectRange, "node %s: capacity %d millicores, %d bytes: out of range", s.Name, s.Capacity.MilliCPU, s.Capacity.MemoryBytes)
	}
	if errs := metavalidation.ValidateLabels(s.Labels, field.NewPath("labels")); len(errs) > 0 {
		return reject(rejectLabels, "node %s: %s", s.Name, oneLine(errs.ToAggregate().Error()))
	}
	if len(s.Replicas) > maxNodeReplicas {
		return reject(rejectTooMany, "node %s: %d replicas, at most %d", s.Name, len(s.Replicas), maxNodeReplicas)
	}
	for i := range s.Replicas {
		if rj := checkReplica(s.Replicas[i], s.Name, subnet); rj != nil {
			rj.err = fmt.Errorf("node %s: replicas[%d]: %w", s.Name, i, rj.err)
			return rj
		}
	}
	return nil
}

func checkReplica(r api.Replica, node string, subnet netip.Prefix) *rejection {
	if err := apiserver.CheckRef(r.Namespace, r.Name); err != nil {
		return reject(rejectName, "%v", err)
	}
	if errs := validation.IsDNS1123Subdomain(r.Workload); len(errs) > 0 {
		return reject(rejectName, "workload %q: %s", r.Workload, strings.Join(errs, "; "))
	}
	if r.Node != node {
		return reject(rejectOrigin, "replica %s says it runs on node %q", r.Name, r.Node)
	}
	if r.Ordinal < 0 || r.Ordinal >= manifest.MaxReplicas || r.Restarts < 0 {
		return reject(rejectRange, "replica %s: ordinal %d, restarts %d", r.Name, r.Ordinal, r.Restarts)
	}
	if !replicaPhases[r.Phase] {
		return reject(rejectPhase, "replica %s: phase %q", r.Name, r.Phase)
	}
	if r.SpecHash != "" && !isHex(r.SpecHash) {
		return reject(rejectSpecHash, "replica %s: spec hash %q", r.Name, r.SpecHash)
	}
	if err := checkText(r.Reason, maxReasonLen); err != nil {
		return reject(rejectText, "replica %s: reason: %v", r.Name, err)
	}
	for _, t := range []*api.Termination{r.Exit, r.LastState} {
		if t != nil && (!terminationReasons[t.Reason] || t.ExitCode < 0 || t.ExitCode > 255 || t.Signal < 0 || t.Signal > 64) {
			return reject(rejectRange, "replica %s: termination %q, exit code %d, signal %d", r.Name, t.Reason, t.ExitCode, t.Signal)
		}
	}
	if r.PodIP != "" {
		ip, err := netip.ParseAddr(r.PodIP)
		if err != nil {
			return reject(rejectPodIP, "replica %s: pod IP %q: %v", r.Name, r.PodIP, err)
		}
		if !subnet.IsValid() || !subnet.Contains(ip) || ip == subnet.Addr() {
			return reject(rejectPodIP, "replica %s: pod IP %s is not inside the node's pod subnet %s", r.Name, ip, subnet)
		}
	}
	return nil
}

// insideCluster reports whether p is a network (no host bits) of prefix
// length cluster.Bits()+1 to 28 inside cluster.
func insideCluster(p, cluster netip.Prefix) bool {
	return p.IsValid() && p == p.Masked() && p.Addr().Is4() && cluster.IsValid() &&
		p.Bits() > cluster.Bits() && p.Bits() <= 28 && cluster.Contains(p.Addr())
}

// checkText refuses invalid UTF-8, control characters and strings longer
// than max bytes.
func checkText(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%d bytes, at most %d", len(s), max)
	}
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f || c >= 0x80 && c < 0xa0 {
			return fmt.Errorf("control character %U", c)
		}
	}
	return nil
}

// oneLine replaces control characters (line breaks among them) with
// spaces and bounds s to maxReasonLen bytes, for text this node publishes
// (a replica's Reason) or logs from a peer.
func oneLine(s string) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f || c >= 0x80 && c < 0xa0 {
			return ' '
		}
		return c
	}, s)
	if len(s) > maxReasonLen {
		s = s[:maxReasonLen]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// isHex reports whether s is 8 to 64 lowercase hex digits (a spec hash).
func isHex(s string) bool {
	if len(s) < 8 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// maxRejectLogKeys bounds the (writer, reason) pairs remembered for
// logging: writers' names come from peers, so the set must not grow
// without bound.
const maxRejectLogKeys = 1024

// rejects checks records received from peers (checkRecord, then the
// version against the clock, then checkSignature), counts the
// refused ones by reason in starling_rejected_records_total and logs a
// WARN once per writer and reason. It is safe for concurrent use.
type rejects struct {
	cluster netip.Prefix
	certs   *certCache                       // the cluster CA's verifier; nil with --insecure
	bound   func(name string) ([]byte, bool) // the key a node name is bound to (Agent.boundKey)
	revoked func(key []byte) bool            // whether a key was revoked (Agent.isRevoked)
	// keyOwner returns the node whose held, live status record is signed
	// by key, if any (Agent.keyOwner).
	keyOwner func(key []byte) (string, bool)
	// heldStatus and heldStatuses read the node statuses this node holds
	// (for checkTakeover); nil until setHeld.
	heldStatus   func(name string) (NodeStatus, bool)
	heldStatuses func() map[string]NodeStatus
	// reserved reports whether a node's subnet claim still holds: the
	// node is live, or down for less than --subnet-reclaim-after.
	reserved func(name string) bool
	// live reports whether a node is alive or suspect in this node's
	// membership view; it is set once gossip runs (setLive) and, until
	// then, every node counts as live.
	live  atomic.Pointer[func(name string) bool]
	log   *slog.Logger
	count *prometheus.CounterVec
	mu    sync.Mutex
	seen  map[[2]string]bool
	full  bool
}

func newRejects(cluster netip.Prefix, creds *credentials, bound func(string) ([]byte, bool), revoked func([]byte) bool, keyOwner func([]byte) (string, bool),
	log *slog.Logger, count *prometheus.CounterVec) *rejects {
	var certs *certCache
	if creds != nil {
		certs = newCertCache(creds.CA)
	}
	return &rejects{cluster: cluster, certs: certs, bound: bound, revoked: revoked, keyOwner: keyOwner, log: log, count: count, seen: map[[2]string]bool{}}
}

// setHeld sets the lookups of the statuses this node holds and of
// whether a node's claim is still reserved.
func (x *rejects) setHeld(one func(string) (NodeStatus, bool), all func() map[string]NodeStatus, reserved func(string) bool) {
	x.heldStatus, x.heldStatuses, x.reserved = one, all, reserved
}

// setLive sets the membership lookup (once gossip runs).
func (x *rejects) setLive(f func(string) bool) { x.live.Store(&f) }

func (x *rejects) isLive(name string) bool {
	f := x.live.Load()
	return f == nil || (*f)(name)
}

// check is the gossip layer's Accept hook.
func (x *rejects) check(r crdt.Record) error {
	rj := checkRecordWith(r, x.cluster, x.checkStatus)
	if limit := time.Now().Add(hlc.MaxOffset).UnixNano(); rj == nil && r.Version.Wall > limit {
		// The gossip layer's clock would drop it too; refusing it here
		// counts and names it like every other refusal.
		rj = reject(rejectClock, "%s: version %s is more than %s ahead of this node's clock", r.Key, r.Version, hlc.MaxOffset)
	}
	if rj == nil {
		rj = checkSignature(r, x.bound, x.revoked)
	}
	if rj == nil {
		rj = x.checkIdentityChange(r)
	}
	if rj == nil {
		return nil
	}
	x.note(r.Origin, rj)
	return rj
}

// checkStatus checks what a node's status says against what this node
// holds: in a secure cluster its certificate (issued by the CA for that
// node and the record's signer), and a new or changed subnet claim
// (checkTakeover).
func (x *rejects) checkStatus(s NodeStatus, r crdt.Record) *rejection {
	if x.certs != nil {
		if err := x.certs.verify(s.Cert, s.Name, r.Signer, time.Now()); err != nil {
			return reject(rejectCert, "status of node %q: %v (a node joins with 'starling join-token')", s.Name, err)
		}
	}
	if x.heldStatus == nil || s.PodSubnet == "" {
		return nil
	}
	if held, ok := x.heldStatus(s.Name); ok && held.PodSubnet == s.PodSubnet && held.SubnetSince == s.SubnetSince {
		return nil // the claim this node already holds: nothing new
	}
	return checkTakeover(s, x.heldStatuses(), x.reserved)
}

// checkTakeover refuses a new or changed subnet claim that would take a
// subnet from another node whose claim on it has settled and is still
// reserved (reserved: the node is live, or down for less than
// --subnet-reclaim-after, as ipam counts it): one that overlaps that
// claim and would beat it (ipam: the earlier claim wins).
// A claim's time is what its writer says, so without this any node could
// backdate a claim and win a live node's subnet. The price: when two
// sides of a partition settle the same subnet (rare: each node starts
// its search at a place derived from its name), each side keeps its own
// claim after the heal, refuses the other's with a WARN, and the
// operator must move one node ('starling node forget' it, remove its
// data dir, join it again). Claims that have not settled resolve as
// before, by time; a node that comes back with the claim it held is not
// affected (checkStatus skips a claim already held).
func checkTakeover(s NodeStatus, held map[string]NodeStatus, reserved func(string) bool) *rejection {
	mine := ipam.Claim{Node: s.Name, Subnet: s.PodSubnet, Since: s.SubnetSince}
	for name, h := range held {
		if name == s.Name || h.PodSubnet == "" || !h.SubnetReady || !reserved(name) {
			continue
		}
		other := ipam.Claim{Node: name, Subnet: h.PodSubnet, Since: h.SubnetSince}
		if _, lost := ipam.Lost(other, []ipam.Claim{mine}); lost {
			return reject(rejectSubnetTaken, "node %q claims %s (time %s), which would take it from node %q (claimed at %s, settled, still reserved); a node may claim only a subnet no other node holds",
				s.Name, s.PodSubnet, s.SubnetSince, name, h.SubnetSince)
		}
	}
	return nil
}

// checkIdentityChange guards the records that unbind a name: a node's
// status record may be deleted (which frees the name) only by the node
// itself or once the key it is bound to is revoked, which 'starling node
// forget' writes first; a revocation is accepted only for a key that is
// not a live node's, and never deleted.
func (x *rejects) checkIdentityChange(r crdt.Record) *rejection {
	kind, rest, _ := strings.Cut(r.Key, "/")
	switch {
	case kind == statusKind && r.Deleted:
		name := strings.TrimPrefix(rest, "cluster/")
		key, ok := x.bound(name)
		if ok && !bytes.Equal(key, r.Signer) && !x.revoked(key) {
			return reject(rejectIdentity, "%s: delete of node %q's record by %q without a revocation of its key (use 'starling node forget', which revokes it first)", r.Key, name, r.Origin)
		}
	case kind == revokedKind && r.Deleted:
		return reject(rejectRevoked, "%s: revocations are never deleted", r.Key)
	case kind == revokedKind:
		var rv revocation
		if json.Unmarshal(r.Value, &rv) != nil {
			return reject(rejectMalformed, "%s: not a revocation", r.Key)
		}
		owner, bound := x.keyOwner(rv.Key)
		if bound && x.isLive(owner) || x.isLive(rv.Name) {
			// 'node forget' refuses a live node; a revocation of a
			// live node's key is not an operator's.
			return reject(rejectRevoked, "%s: revocation of the key of node %q, which is alive", r.Key, rv.Name)
		}
	}
	return nil
}

// note counts a refusal and logs it if this writer has not been logged
// for this reason before.
func (x *rejects) note(writer string, rj *rejection) {
	x.count.WithLabelValues(rj.reason).Inc()
	k := [2]string{writer, rj.reason}
	x.mu.Lock()
	first := !x.seen[k] && len(x.seen) < maxRejectLogKeys
	if first {
		x.seen[k] = true
	}
	overflow := !first && !x.full && len(x.seen) >= maxRejectLogKeys
	if overflow {
		x.full = true
	}
	x.mu.Unlock()
	switch {
	case first:
		x.log.Warn("refused a record from a peer (logged once per writer and reason; see starling_rejected_records_total)",
			"writer", oneLine(writer), "reason", rj.reason, "err", oneLine(rj.err.Error()))
	case overflow:
		x.log.Warn("refused records from too many writers to log each; counting only (starling_rejected_records_total)")
	}
}
