package node

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/net/ipam"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/rollout"
	"github.com/starling-orchestrator/starling/node/sealed"
	"github.com/starling-orchestrator/starling/node/trust"
	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/node/volumes"
)

// Every record a peer sends is untrusted input, like an API body: it is
// parsed into typed values and checked against what its writer may say
// before it is stored, forwarded or acted on (checkRecord, the gossip
// layer's Accept hook). Where statuses are read (view.DecodeStatuses) the
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
	maxNodeReplicas = 4096           // replicas one node record may list
	maxMilliCPU     = 1 << 20 * 1000 // a million cores: no real node shows more
	maxMemoryBytes  = 1 << 50        // 1 PiB
)

// rejection is why a record was refused: a reason (a metric label) and a
// message for the log.
type rejection struct {
	reason string
	err    error
	// rival is, for rejectSubnetTaken, the refused record's claim (with
	// whether it settled): the node it would displace may have to move
	// (subnetmove.go).
	rival *ipam.Claim
}

func (r *rejection) Error() string { return r.reason + ": " + r.err.Error() }

func reject(reason, format string, args ...any) *rejection {
	return &rejection{reason: reason, err: fmt.Errorf(format, args...)}
}

// replicaPhases are the phases a node may report (api.Replica.Phase).
var replicaPhases = map[api.Phase]bool{
	api.PhasePending: true, api.PhaseContainerCreating: true, api.PhaseCreateBackOff: true, api.PhaseConfigError: true, api.PhaseRunning: true,
	api.PhaseCrashLoopBackOff: true, api.PhaseExited: true, api.PhaseTerminating: true, api.PhaseUnknown: true,
	api.PhaseInit: true, api.PhasePodInitializing: true,
}

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
	_, rj := checkRecordWith(r, cluster, nil)
	return rj
}

// decoded is what the check of one record decoded: a node's status (its
// times capped at the write, view.CapTimes) or a desired object; at most
// one is set. The caller hands it to the view (view.Checked) once every
// check of the record, signature included, has passed.
type decoded struct {
	status *view.NodeStatus
	object *manifest.Object
}

// noteIn keeps d in c for the view, as decoded from r.
func (d decoded) noteIn(c *view.Checked, r crdt.Record, cluster netip.Prefix) {
	switch {
	case d.status != nil:
		c.Note(r, *d.status, cluster)
	case d.object != nil:
		c.NoteObject(r, *d.object)
	}
}

// checkRecordWith is checkRecord with more checks of a node's status
// (rejects.checkStatus: its certificate, its subnet claim against the
// claims held), run once the status decodes and passes checkStatus. It
// returns what it decoded of a status or desired object that passed.
func checkRecordWith(r crdt.Record, cluster netip.Prefix, more func(view.NodeStatus, crdt.Record) *rejection) (decoded, *rejection) {
	kind, _, _ := strings.Cut(r.Key, "/")
	if r.Deleted {
		if len(r.Value) > 0 {
			return decoded{}, reject(rejectTombstone, "%s: a delete with a %d-byte value", r.Key, len(r.Value))
		}
		switch kind {
		case view.StatusKind, imageKind, trust.RevokedKind, trust.JoinTokenKind, rollout.Kind, strings.ToLower(manifest.KindDeployment), strings.ToLower(manifest.KindStatefulSet), strings.ToLower(manifest.KindService),
			strings.ToLower(manifest.KindConfigMap), strings.ToLower(manifest.KindSecret), strings.ToLower(manifest.KindPersistentVolumeClaim),
			strings.ToLower(manifest.KindIngress):
			return decoded{}, nil
		}
		return decoded{}, reject(rejectKey, "unknown kind %q in key %q", kind, r.Key)
	}
	switch kind {
	case view.StatusKind:
		var s view.NodeStatus
		// Unknown fields are ignored (a newer node may add some); what
		// this node reads is checked.
		if err := json.Unmarshal(r.Value, &s); err != nil {
			return decoded{}, reject(rejectMalformed, "%s: %v", r.Key, err)
		}
		if view.StatusKey(s.Name) != r.Key {
			return decoded{}, reject(rejectKey, "record %q holds the status of node %q", r.Key, s.Name)
		}
		if r.Origin != s.Name {
			return decoded{}, reject(rejectOrigin, "status of node %q written by %q: a node writes only its own status", s.Name, r.Origin)
		}
		// Checked as every node will read it: its times capped at the
		// write (view.CapTimes), so a claim dated in the future is judged
		// by the earlier time it will be stored with.
		view.CapTimes(&s, r.Version)
		if rj := checkStatus(s, cluster); rj != nil {
			return decoded{}, rj
		}
		if more != nil {
			if rj := more(s, r); rj != nil {
				return decoded{}, rj
			}
		}
		return decoded{status: &s}, nil
	case imageKind:
		return noDecoding(checkImage(r.Key, r.Value))
	case trust.RevokedKind:
		return noDecoding(checkRevocation(r.Key, r.Value))
	case trust.JoinTokenKind:
		return noDecoding(checkJoinToken(r.Key, r.Value))
	case rollout.Kind:
		rev, err := rollout.Decode(r.Value)
		if err != nil {
			return decoded{}, reject(rejectMalformed, "%s: %v", r.Key, err)
		}
		if err := apiserver.CheckRef(rev.Namespace, rev.Deployment); err != nil {
			return decoded{}, reject(rejectName, "%s: %v", r.Key, err)
		}
		if !api.IsSpecHash(rev.SpecHash) {
			return decoded{}, reject(rejectSpecHash, "%s: spec hash %q", r.Key, rev.SpecHash)
		}
		if rollout.Key(rev.Namespace, rev.Deployment, rev.SpecHash) != r.Key {
			return decoded{}, reject(rejectKey, "record %q holds revision %s of %s/%s", r.Key, rev.SpecHash, rev.Namespace, rev.Deployment)
		}
		if err := api.CheckText(rev.ChangeCause, 64<<10); err != nil {
			return decoded{}, reject(rejectText, "%s: changeCause: %v", r.Key, err)
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
			return decoded{}, reject(rejectMalformed, "%s: %v", r.Key, err)
		}
		if _, err := manifest.Decode(b); err != nil {
			return decoded{}, reject(rejectObject, "%s: template: %v", r.Key, api.OneLine(err.Error()))
		}
		return decoded{}, nil
	case strings.ToLower(manifest.KindDeployment), strings.ToLower(manifest.KindStatefulSet), strings.ToLower(manifest.KindService),
		strings.ToLower(manifest.KindConfigMap), strings.ToLower(manifest.KindPersistentVolumeClaim), strings.ToLower(manifest.KindIngress):
		o, err := manifest.Decode(r.Value)
		if err != nil {
			return decoded{}, reject(rejectObject, "%s: %v", r.Key, api.OneLine(err.Error()))
		}
		if o.Key() != r.Key {
			return decoded{}, reject(rejectKey, "record %q holds %s", r.Key, o.Key())
		}
		if o.Kind == manifest.KindConfigMap {
			return decoded{}, nil // the view decodes ConfigMaps itself (configInto)
		}
		return decoded{object: &o}, nil
	case strings.ToLower(manifest.KindSecret):
		if err := sealed.Check(r.Key, r.Value); err != nil { // its data: when opened
			return decoded{}, reject(rejectObject, "%s: %v", r.Key, api.OneLine(err.Error()))
		}
		return decoded{}, nil
	}
	return decoded{}, reject(rejectKey, "unknown kind %q in key %q", kind, r.Key)
}

// noDecoding is a check's result with nothing decoded for the view.
func noDecoding(rj *rejection) (decoded, *rejection) { return decoded{}, rj }

// checkStatus checks what a node says of itself: its name and labels are
// Kubernetes names, its addresses parse, its pod subnet is a network
// inside --cluster-cidr (between the cluster's size and a /28, as
// --pod-subnet allows), capacity is within what a machine can have, and
// every replica it lists has Kubernetes names, a known phase, and an
// address inside the node's own pod subnet.
func checkStatus(s view.NodeStatus, cluster netip.Prefix) *rejection {
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
		if !view.InsideCluster(p, cluster) {
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
		return reject(rejectLabels, "node %s: %s", s.Name, api.OneLine(errs.ToAggregate().Error()))
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
	for i, b := range s.Volumes {
		if err := apiserver.CheckRef(b.Namespace, b.Claim); err != nil || i >= maxNodeReplicas || !volumes.ValidUID(b.UID) || b.Capacity < 0 || b.Used < 0 {
			return reject(rejectRange, "node %s: volumes[%d]: want at most %d bindings of a claim name, a UUID and sizes of 0 or more", s.Name, i, maxNodeReplicas)
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
	if r.SpecHash != "" && !api.IsSpecHash(r.SpecHash) {
		return reject(rejectSpecHash, "replica %s: spec hash %q", r.Name, r.SpecHash)
	}
	if err := api.CheckText(r.Reason, api.MaxReasonLen); err != nil {
		return reject(rejectText, "replica %s: reason: %v", r.Name, err)
	}
	for _, t := range []*api.Termination{r.Exit, r.LastState} {
		if err := t.Check(); err != nil {
			return reject(rejectRange, "replica %s: %v", r.Name, err)
		}
	}
	if len(r.Containers) > api.MaxContainers {
		return reject(rejectRange, "replica %s: %d containers", r.Name, len(r.Containers))
	}
	for _, c := range r.Containers {
		if err := c.Check(); err != nil {
			return reject(rejectRange, "replica %s: %v", r.Name, err)
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
