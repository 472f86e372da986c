package node

import (
	"sync/atomic"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/announce"
	"github.com/starling-orchestrator/starling/node/dataplane"
	"github.com/starling-orchestrator/starling/node/ingress"
	"github.com/starling-orchestrator/starling/node/names"
	"github.com/starling-orchestrator/starling/node/trust"
	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/node/volumes"
)

// guard is who may say what: this node's identity, the cluster's
// credentials, the admission of new nodes, and the checks every record
// (rejects) and every member (memberAuth) passes before it counts.
type guard struct {
	id *trust.Identity
	// trust holds the cluster's credentials and this node's certificate
	// (node/trust/pki.go, node/trust/peertls.go), join admits new nodes
	// (node/trust/tokens.go) and keys rotates the gossip key
	// (node/trust/keys.go); all three nil with --insecure.
	trust   *trust.Trust
	join    *trust.Admission
	keys    *trust.Keyring
	rejects *rejects
	// auth binds membership to node keys (memberauth.go).
	auth *memberAuth
}

// membership is the gossip layer and what the node makes of it: who is
// up (members), who answers (acks), and who answers peers' questions.
type membership struct {
	cluster *gossip.Cluster
	// writer signs and gossips this node's records.
	writer  *writer
	members *members
	acks    *view.AckTracker
	// answerer answers peers' quorum questions once wired.
	answerer atomic.Pointer[fence]
}

// ownParts is this node's own say: its status record (self) and its pod
// subnet's claim (subnets).
type ownParts struct {
	status  *self
	subnets *subnets
}

// workloads are the controllers of this node's replicas: reconcile
// (replicas), readiness (probes), fencing of StatefulSet replicas (fence,
// lease), images and logs.
type workloads struct {
	replicas *replicas
	probes   *prober
	fence    *fence
	lease    *lease
	images   *images
	logs     *logs
	// volumes rewrites projected volumes' files, claims binds and makes
	// the volumes of PersistentVolumeClaims (node/volumes).
	volumes *volumes.Updater
	claims  *volumes.Binder
}

// network is the host's network controllers (package dataplane), or the
// dry run's printers with --dry-run.
type network struct {
	routes   *dataplane.Routes
	services *dataplane.Services
	host     *dataplane.HostRules
	dry      *dryRun             // with --dry-run only
	dns      *names.Supervisor   // with --cluster-dns on a real host only
	ingress  *ingress.Controller // on a real host only
	lb       *announce.Announcer // on a real host only
}

// apiParts serve the API: stored objects, cluster information, calls to
// peers, and the token clients present.
type apiParts struct {
	objects *objects
	info    *info
	peers   *peers
	token   string
}
