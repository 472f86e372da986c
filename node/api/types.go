// Package api holds the agent's HTTP API: its JSON shapes, shared by the
// agent (node), its client (node/client) and the CLI; the route table
// (routes.go), from which the server registers and the client builds
// every request; and its errors (errors.go), Kubernetes' metav1.Status
// with the HTTP code. The API is served on the unix socket
// <data-dir>/starling.sock, and over TCP (--api-listen) with TLS and a
// bearer token.
package api

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	corev1 "k8s.io/api/core/v1"
)

// Version answers /v1/version.
type Version struct {
	Version string `json:"version"`
	Node    string `json:"node"`
}

// JoinTokenRequest is the body of POST /v1/join-tokens.
type JoinTokenRequest struct {
	// TTLSeconds is how long the token admits nodes, in seconds (60 to
	// 31536000); 0 means the default, 24 hours.
	TTLSeconds int64 `json:"ttlSeconds,omitempty"`
}

// JoinToken answers POST /v1/join-tokens.
type JoinToken struct {
	// Token is the join token: SLTKN-1-<CA pin>-<ID>.<secret>.
	Token   string    `json:"token"`
	Expires time.Time `json:"expires"`
}

// ClientConfig is what the CLI needs to reach a cluster over TCP: the
// agent's API URL, the pin of the cluster CA its certificate must chain
// to, and the bearer token. GET /v1/client-config answers it; 'starling
// config' writes it as the CLI's config file (YAML, these field names).
type ClientConfig struct {
	// Server is the agent's TCP API, "https://IP:PORT" ("http://" with
	// --insecure); empty when the agent serves only its unix socket.
	Server string `json:"server"`
	// CAPin is the SHA-256 of the cluster CA's SubjectPublicKeyInfo, 64
	// hex digits; empty with --insecure.
	CAPin string `json:"caPin,omitempty"`
	// ServerPin is the SHA-256 of the server node's certificate key
	// (its x509 SubjectPublicKeyInfo), 64 hex digits: the CLI accepts only that
	// node, since any node of the cluster can make certificates.
	ServerPin string `json:"serverPin,omitempty"`
	// Token is the API bearer token.
	Token string `json:"token,omitempty"`
}

// KeyRotation answers POST /v1/keys/rotate: what a gossip key rotation
// did. Keys are named by IDs (16 hex digits of their SHA-256), never
// shown.
type KeyRotation struct {
	// Key is the ID of the new key.
	Key string `json:"key"`
	// Resumed: the node's keyring held more than one key (a rotation that
	// had not finished); it was completed with the key in use instead of
	// a new one.
	Resumed bool `json:"resumed,omitempty"`
	// Nodes are the live members the rotation went through; Down the
	// known nodes that were not live (they take the new key from a peer
	// when they come back); Skipped the members, live or not, with no
	// certified identity (a forgotten node), which get no key.
	Nodes   []string  `json:"nodes"`
	Down    []string  `json:"down,omitempty"`
	Skipped []string  `json:"skipped,omitempty"`
	Steps   []KeyStep `json:"steps"`
}

// ForgetResult answers DELETE /v1/nodes/{name} ('starling node forget').
type ForgetResult struct {
	Name string `json:"name"`
	// RevokedKey is the ID (16 hex digits of its SHA-256) of the node key
	// revoked; empty when the node's record had no signer (--insecure).
	RevokedKey string `json:"revokedKey,omitempty"`
	// Rotation is the gossip key rotation the forget started, so the
	// forgotten node can no longer read or write gossip; nil with
	// --insecure. RotationError says why it did not finish (the node is
	// forgotten all the same; 'starling keys rotate' finishes it).
	Rotation      *KeyRotation `json:"rotation,omitempty"`
	RotationError string       `json:"rotationError,omitempty"`
}

// KeyStep is one step of a key rotation on every node.
type KeyStep struct {
	Op     string   `json:"op"` // install, use or remove
	Key    string   `json:"key"`
	Failed []string `json:"failed,omitempty"` // "node: error"
}

// ApplyRequest carries objects as their canonical JSON (manifest.Encode).
type ApplyRequest struct {
	Objects []json.RawMessage `json:"objects"`
}

// ApplyResult says what happened to one object: "created", "configured",
// "unchanged", "deleted" or "scaled"; for rollout commands "rolled back",
// "skipped rollback (current template already matches revision N)",
// "restarted", "paused" or "resumed".
type ApplyResult struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Result    string `json:"result"`
}

// ApplyResponse answers an apply, one result per object in order.
type ApplyResponse struct {
	Results []ApplyResult `json:"results"`
}

// Object is one stored object with its store metadata.
type Object struct {
	Object json.RawMessage `json:"object"`
	// Version is the write's hybrid logical clock time, Origin the node that
	// accepted the write, and Signer the ID of the key that signed it
	// (16 hex digits of the key's SHA-256; "unsigned" for a record written
	// before records were signed). Every node checks the signature, and
	// that the key is the one Origin's name is bound to, before it stores
	// a record.
	Version string `json:"version"`
	Origin  string `json:"origin"`
	Signer  string `json:"signer,omitempty"`
	// DataSizes holds a Secret's value sizes in bytes, by key, when its
	// values were not asked for (the object then holds no data).
	DataSizes map[string]int `json:"dataSizes,omitempty"`
}

// ObjectList answers a list of one kind.
type ObjectList struct {
	Items []Object `json:"items"`
}

// ScaleRequest sets a Deployment's replicas.
type ScaleRequest struct {
	Replicas int32 `json:"replicas"`
}

// Phase is where a replica is in its life.
type Phase string

const (
	// PhasePending: no container yet (placed, or waiting for the old
	// copy to stop).
	PhasePending Phase = "Pending"
	// PhaseContainerCreating: its container is being created (the image
	// may be on its way; see Reason).
	PhaseContainerCreating Phase = "ContainerCreating"
	// PhaseCreateBackOff: the create failed and waits to be retried
	// (Reason says why).
	PhaseCreateBackOff Phase = "CreateBackOff"
	// PhaseConfigError: the create waits for a ConfigMap, Secret or key
	// its env names (Reason names it); it starts once that is there.
	PhaseConfigError Phase = "CreateContainerConfigError"
	// PhaseInit: its init containers run, one after the other (its
	// Containers say which; get shows Init:N/M); PhasePodInitializing:
	// they are done, its app containers are being started.
	PhaseInit            Phase = "Init"
	PhasePodInitializing Phase = "PodInitializing"
	// PhaseRunning: its task runs (Ready says whether it serves).
	PhaseRunning Phase = "Running"
	// PhaseCrashLoopBackOff: it exited and waits for its restart backoff.
	PhaseCrashLoopBackOff Phase = "CrashLoopBackOff"
	// PhaseExited: it exited, its backoff is over; a restart follows.
	PhaseExited Phase = "Exited"
	// PhaseTerminating: no longer desired here, being stopped.
	PhaseTerminating Phase = "Terminating"
	// PhaseUnknown: containerd reports a state Starling does not know,
	// or a record an earlier run of its node's agent wrote lists it (the
	// node restarted; its state is unknown until the new run's record
	// arrives).
	PhaseUnknown Phase = "Unknown"
)

// HasContainer reports whether a replica in phase p has a container on
// its node: not while Pending, CreateBackOff or
// CreateContainerConfigError.
func (p Phase) HasContainer() bool {
	return p != PhasePending && p != PhaseCreateBackOff && p != PhaseConfigError
}

// Available reports whether the replica serves: running and ready, the
// one readiness count of get, describe and rollout status.
func (r Replica) Available() bool { return r.Phase == PhaseRunning && r.Ready }

// Replica is one replica, desired or running, as `get replicas` shows it.
type Replica struct {
	Name      string    `json:"name"`
	Namespace string    `json:"namespace"`
	Workload  string    `json:"workload"`
	Ordinal   int       `json:"ordinal"`
	Node      string    `json:"node"`
	Phase     Phase     `json:"phase"`
	Ready     bool      `json:"ready"`
	PodIP     string    `json:"podIP"`
	SpecHash  string    `json:"specHash"`
	Restarts  int       `json:"restarts"`
	Started   time.Time `json:"started,omitempty"`
	// Created is when the replica's container was created (AGE).
	Created time.Time `json:"created,omitempty"`
	// Reason says why a replica is not running: the last error of its
	// create or start, or why placement found no node for it.
	Reason string `json:"reason,omitempty"`
	// Exit is how the current run ended (phase Exited or
	// CrashLoopBackOff); LastState how the run before it ended (kubectl's
	// Last State). Nil when there is none.
	Exit      *Termination `json:"exit,omitempty"`
	LastState *Termination `json:"lastState,omitempty"`
	// Containers are its containers, init containers first, for a
	// replica of more than one (none for one: the fields above are
	// its); Ready then says all of its app containers and sidecars are.
	Containers []ContainerStatus `json:"containers,omitempty"`
}

// MaxContainers bounds the containers of a replica a node may report.
const MaxContainers = 64

// ContainerStatus is one container of a replica, as kubectl's
// containerStatuses and initContainerStatuses show it.
type ContainerStatus struct {
	Name string `json:"name"`
	// Init: an init container; Sidecar: one with restartPolicy Always.
	Init    bool `json:"init,omitempty"`
	Sidecar bool `json:"sidecar,omitempty"`
	// State is "Waiting" (not created or started yet, or waiting for its
	// restart: Reason says which), "Running" or "Terminated" (Exit says
	// how; a completed init container stays so).
	State     string       `json:"state"`
	Reason    string       `json:"reason,omitempty"`
	Ready     bool         `json:"ready"`
	Restarts  int          `json:"restarts"`
	Started   time.Time    `json:"started,omitempty"`
	Exit      *Termination `json:"exit,omitempty"`
	LastState *Termination `json:"lastState,omitempty"`
}

// Container states (ContainerStatus.State).
const (
	ContainerWaiting    = "Waiting"
	ContainerRunning    = "Running"
	ContainerTerminated = "Terminated"
)

// Check reports what is wrong with c as a peer's record says it (names,
// states, counts, texts and terminations within bounds).
func (c ContainerStatus) Check() error {
	if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 {
		return fmt.Errorf("container name %q: %s", c.Name, strings.Join(errs, "; "))
	}
	switch {
	case c.State != ContainerWaiting && c.State != ContainerRunning && c.State != ContainerTerminated:
		return fmt.Errorf("container %s: state %q", c.Name, c.State)
	case c.Restarts < 0:
		return fmt.Errorf("container %s: restarts %d", c.Name, c.Restarts)
	}
	if err := CheckText(c.Reason, MaxReasonLen); err != nil {
		return fmt.Errorf("container %s: reason: %w", c.Name, err)
	}
	for _, t := range []*Termination{c.Exit, c.LastState} {
		if err := t.Check(); err != nil {
			return fmt.Errorf("container %s: %w", c.Name, err)
		}
	}
	return nil
}

// Check reports what is wrong with t (nil is fine): a reason other than
// Completed, Error and OOMKilled, an exit code outside 0-255, a signal
// outside 0-64.
func (t *Termination) Check() error {
	if t == nil {
		return nil
	}
	if t.Reason != "Completed" && t.Reason != "Error" && t.Reason != "OOMKilled" || t.ExitCode < 0 || t.ExitCode > 255 || t.Signal < 0 || t.Signal > 64 {
		return fmt.Errorf("termination %q, exit code %d, signal %d", t.Reason, t.ExitCode, t.Signal)
	}
	return nil
}

// DNSQuery is a name to look up (`starling dns lookup`): Name, of Type
// ("A", "SRV"), as a pod of Namespace resolves it. With From, as replica
// From of Namespace resolves it on its own node: the node asked sends
// the query there. Node, set by the node that forwards a query, is the
// node that must answer it (it never forwards it again).
type DNSQuery struct {
	Name, Type, Namespace, From, Node string
}

// Values is q as the query of RouteDNSLookup (DNSQueryOf reads it).
func (q DNSQuery) Values() url.Values {
	v := url.Values{"name": {q.Name}, "type": {q.Type}, "namespace": {q.Namespace}}
	for k, s := range map[string]string{"from": q.From, "node": q.Node} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// DNSQueryOf reads a query of RouteDNSLookup (Values); the type is "A"
// and the namespace "default" unless it says otherwise.
func DNSQueryOf(v url.Values) DNSQuery {
	return DNSQuery{Name: v.Get("name"), Type: cmp.Or(v.Get("type"), "A"), Namespace: cmp.Or(v.Get("namespace"), "default"),
		From: v.Get("from"), Node: v.Get("node")}
}

// DNSAnswer is a name looked up as a pod of Namespace on Node resolves
// it (`starling dns lookup`): through the node's DNS (Server), trying
// the search path as ndots:5 says (Tried, in order); Name is the name
// that answered, Rcode its DNS rcode ("NOERROR", "NXDOMAIN"), Answers
// its records as text.
type DNSAnswer struct {
	Node      string   `json:"node"`
	Server    string   `json:"server"`
	Namespace string   `json:"namespace"`
	Tried     []string `json:"tried"`
	Name      string   `json:"name"`
	Rcode     string   `json:"rcode"`
	Answers   []string `json:"answers,omitempty"`
}

// SortReplicas sorts items by namespace, workload, ordinal, name and
// node.
func SortReplicas(items []Replica) {
	sort.Slice(items, func(i, j int) bool {
		a, b := items[i], items[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Workload != b.Workload {
			return a.Workload < b.Workload
		}
		if a.Ordinal != b.Ordinal {
			return a.Ordinal < b.Ordinal
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.Node < b.Node
	})
}

// UTC is a copy of t with its times in UTC, as the API shows them (nil
// for nil).
func (t *Termination) UTC() *Termination {
	if t == nil {
		return nil
	}
	u := *t
	u.StartedAt, u.FinishedAt = t.StartedAt.UTC(), t.FinishedAt.UTC()
	return &u
}

// Termination is how a run of a container ended, in the shape of
// Kubernetes' ContainerStateTerminated.
type Termination struct {
	ExitCode int `json:"exitCode"`
	// Signal is the signal that ended the run (exit status 128+n).
	Signal int `json:"signal,omitempty"`
	// Reason: "Completed" (exit 0), "Error" (another exit) or "OOMKilled".
	Reason     string    `json:"reason"`
	StartedAt  time.Time `json:"startedAt"`
	FinishedAt time.Time `json:"finishedAt"`
}

// ReplicaList answers /v1/replicas.
type ReplicaList struct {
	Items []Replica `json:"items"`
}

// Node is one cluster member as `get nodes` shows it.
type Node struct {
	Name      string    `json:"name"`
	State     string    `json:"state"` // alive, suspect, dead, left
	Address   string    `json:"address"`
	PodSubnet string    `json:"podSubnet"`
	Replicas  int       `json:"replicas"`
	Started   time.Time `json:"started"` // when its agent's current run started
	// Joined is when the node first started with its data dir (its
	// member metadata's member-since): get nodes' AGE.
	Joined time.Time `json:"joined,omitempty"`
	// Ready: the node's subnet claim has settled and it takes replicas.
	Ready bool `json:"ready"`
	// API is the node's TCP API URL ("" when it serves only its socket).
	API string `json:"api,omitempty"`
	// RTT is the Vivaldi-estimated round trip time from the answering node.
	RTT string `json:"rtt,omitempty"`
	// Insecure: the node runs with --insecure (gossip in the clear).
	Insecure bool `json:"insecure,omitempty"`
	// Unresponsive: the node left a replica placed on it unlisted in its
	// status for longer than the acknowledgement timeout (30 s), so this
	// node's placement leaves it out for a while (node/view/unresponsive.go).
	Unresponsive bool `json:"unresponsive,omitempty"`
	// DiskFull: the node's data directory is full (below 64 MiB free); it
	// refuses API writes and keeps running its replicas.
	DiskFull bool `json:"diskFull,omitempty"`
}

// NodeList answers /v1/nodes.
type NodeList struct {
	Items []Node `json:"items"`
}

// Image is one stored image.
type Image struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// ImageList answers /v1/images.
type ImageList struct {
	Items []Image `json:"items"`
}

// Revision is one pod template a Deployment has run, as stored in the
// record "revision/<namespace>/<deployment>-<specHash>" (gossiped like
// every record) and listed by the history endpoint.
type Revision struct {
	Namespace  string `json:"namespace"`
	Deployment string `json:"deployment"`
	// Revision numbers a Deployment's templates 1, 2, ...: a template new
	// to the Deployment, or one it had before, gets the highest number
	// plus one (Kubernetes' deployment.kubernetes.io/revision).
	Revision int64  `json:"revision"`
	SpecHash string `json:"specHash"`
	// ChangeCause is the Deployment's kubernetes.io/change-cause annotation
	// when this template was applied.
	ChangeCause string `json:"changeCause,omitempty"`
	// Created is when the template was first recorded (UTC, seconds).
	Created  time.Time              `json:"created"`
	Template corev1.PodTemplateSpec `json:"template"`
}

// RevisionList answers the history endpoint, oldest revision first.
type RevisionList struct {
	Items []Revision `json:"items"`
}

// UndoRequest picks the revision to roll back to; 0 means the newest one
// whose template differs from the current one.
type UndoRequest struct {
	ToRevision int64 `json:"toRevision,omitempty"`
}

// RolloutCounts is the progress of a Deployment towards its current spec
// hash with Replicas replicas, counted over the replica copies that live
// nodes report in their status records (rollout.Count):
//   - Updated: ordinals 0..Replicas-1 with a copy of the current hash
//     that is not Terminating;
//   - Ready: those ordinals whose current-hash copy is Running and ready;
//   - Available: ordinals 0..Replicas-1 with a Running, ready copy of any
//     hash (each ordinal counted once);
//   - Old: copies that are not part of the target: another hash, or an
//     ordinal >= Replicas, in any phase (Terminating included).
//
// A rollout is complete when Updated == Ready == Replicas and Old == 0.
type RolloutCounts struct {
	Replicas  int `json:"replicas"`
	Updated   int `json:"updated"`
	Ready     int `json:"ready"`
	Available int `json:"available"`
	Old       int `json:"old"`
}

// RolloutStatus answers the status endpoint: the Deployment's current
// template and its progress, as the answering node sees the cluster.
type RolloutStatus struct {
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
	SpecHash   string `json:"specHash"`
	// Revision is the current template's revision number, 0 when none is
	// recorded (a Deployment stored before revisions existed).
	Revision int64 `json:"revision"`
	Paused   bool  `json:"paused"`
	// ProgressDeadlineSeconds is spec.progressDeadlineSeconds (default 600).
	ProgressDeadlineSeconds int32 `json:"progressDeadlineSeconds"`
	RolloutCounts
	Done bool `json:"done"`
}

// JoinRequest is the body of POST /v1/join on a member's peer port: a
// node asking to be admitted with an invitation ('starling join-token
// NAME'): its certificate, and its signature proving it holds the key.
type JoinRequest struct {
	Name string `json:"name"`
	Key  []byte `json:"key"`  // the node's Ed25519 public key
	Cert []byte `json:"cert"` // the invitation's certificate, DER
	// Server is the pin (hex SHA-256 of the SubjectPublicKeyInfo) of
	// the member the request is meant for.
	Server string `json:"server"`
	Time   int64  `json:"time"` // when the request was signed, Unix seconds
	Sig    []byte `json:"sig"`  // Ed25519 signature by Key (trust.JoinSigningBytes)
	// TokenID and Secret are a version 1 token's (before invitations):
	// such a request is refused with a message saying what to do.
	TokenID string `json:"tokenID,omitempty"`
	Secret  string `json:"secret,omitempty"`
}

// JoinAnswer is the answer to an admitted node.
type JoinAnswer struct {
	CA         []byte   `json:"ca"`         // CA certificate, DER
	GossipKeys [][]byte `json:"gossipKeys"` // 32 bytes each, the one in use first
}

// KeyOp is the body of POST /v1/keys on the peer port: one step of a
// gossip key rotation on one node.
type KeyOp struct {
	Op  string `json:"op"`  // "install", "use" or "remove"
	Key []byte `json:"key"` // 32 bytes
	// Revoked are node keys (Ed25519 public keys, at most 16) that the
	// receiver must already hold as revoked before it installs Key: the
	// rotation that 'node forget' starts must not hand the new key to
	// the forgotten node through a member its revocation has not reached
	// yet. The receiver answers 409 until then.
	Revoked [][]byte `json:"revoked,omitempty"`
}

// KeyList answers GET /v1/keys on the peer port: the node's gossip
// keyring, the key in use first.
type KeyList struct {
	Keys [][]byte `json:"keys"`
}

// MaxObjectBytes bounds the encoding of one object (manifest.Encode): a
// node keeps every object and gossips it whole, so one object is at most
// what etcd lets Kubernetes store by default (1.5 MiB), rounded down.
const MaxObjectBytes = 1 << 20

// LoadBalancerCondition is the condition of a LoadBalancer Service's
// status that says why it has no address yet (status False, reason
// Pending, the allocation's reason as message).
const LoadBalancerCondition = "LoadBalancerAddress"
