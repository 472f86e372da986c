// Package apiserver serves the agent's HTTP API (node/api): it decodes
// requests, bounds their bodies, checks names, calls the agent through the
// small interfaces of Backend, and writes answers and errors (a
// metav1.Status with its HTTP code, api.ErrorBody). It holds no state of
// the cluster: every answer comes from the Backend, which the agent
// (package node) implements with its own small types.
//
// Two handlers: Handler, the operator's API (unix socket and TCP), and
// PeerHandler, the node-to-node API on the peer port.
package apiserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/dustin/go-humanize"
	"github.com/opencontainers/go-digest"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// Objects is the desired state: what apply, get, delete, scale and the
// rollout commands read and write. Errors are api errors (api.NewError,
// api.Errorf) with the status to answer; any other error is a 500.
type Objects interface {
	// Apply stores validated objects, all or none.
	Apply(objs []manifest.Object) ([]api.ApplyResult, error)
	// List returns the live objects of kind (a manifest kind).
	List(kind string) ([]api.Object, error)
	Get(kind, namespace, name string) (api.Object, error)
	Delete(kind, namespace, name string) (api.ApplyResult, error)
	// Scale sets the replicas of a Deployment or StatefulSet.
	Scale(kind, namespace, name string, replicas int32) (api.ApplyResult, error)
	// ReleaseClaim gives up the data of a PersistentVolumeClaim whose
	// node is gone (409 while its node is up).
	ReleaseClaim(namespace, name string) (api.ApplyResult, error)
	RolloutStatus(namespace, name string) (api.RolloutStatus, error)
	RolloutHistory(namespace, name string) ([]api.Revision, error)
	// Rollout runs a rollout command (RolloutUndo, Restart, Pause,
	// Resume) on a Deployment; to is undo's revision (0: the previous).
	Rollout(cmd RolloutCommand, namespace, name string, to int64) (api.ApplyResult, error)
}

// RolloutCommand is a rollout command that changes a Deployment.
type RolloutCommand string

// Rollout commands.
const (
	RolloutUndo    RolloutCommand = "undo"
	RolloutRestart RolloutCommand = "restart"
	RolloutPause   RolloutCommand = "pause"
	RolloutResume  RolloutCommand = "resume"
)

// Info is what this node knows of the cluster.
type Info interface {
	Version() api.Version
	Replicas() []api.Replica
	Nodes() []api.Node
	// Forget forgets a dead or departed node (409 for a live one).
	Forget(ctx context.Context, name string) (api.ForgetResult, error)
}

// Admin is what an operator runs on the cluster's credentials.
type Admin interface {
	JoinToken(req api.JoinTokenRequest) (api.JoinToken, error)
	ClientConfig() api.ClientConfig
	RotateKeys(ctx context.Context) (api.KeyRotation, error)
}

// Images is this node's image store.
type Images interface {
	// Import loads an image tarball (bounded by the server) and returns
	// the names it held.
	Import(ctx context.Context, tarball io.Reader) ([]api.Image, error)
	List(ctx context.Context) ([]api.Image, error)
	// WriteBlob writes content blob d to w, calling size first;
	// errdefs.ErrNotFound when the node lacks it.
	WriteBlob(ctx context.Context, d digest.Digest, size func(int64), w io.Writer) error
}

// Logs streams a replica's log: from this node, or from the node that
// runs it. It writes the whole answer, error or not.
type Logs interface {
	ServeLogs(w http.ResponseWriter, r *http.Request, namespace, name string, o api.LogOptions)
}

// DNS looks names up as a pod of a namespace on this node would, or, for
// a query from a replica (api.DNSQuery.From), as the replica would on its
// node (node/names); nil: the node serves no DNS.
type DNS interface {
	Lookup(ctx context.Context, q api.DNSQuery) (api.DNSAnswer, error)
}

// Backend is everything the operator's API serves.
type Backend struct {
	Node    string // this node's name, for messages
	Objects Objects
	Info    Info
	Admin   Admin
	Images  Images
	Logs    Logs
	DNS     DNS
	Metrics http.Handler
	// MaxImageBytes bounds an image import (--max-image-size).
	MaxImageBytes int64
	// Log receives the audit lines (a Secret's values revealed); nil:
	// none.
	Log *slog.Logger
}

// maxApplyBytes bounds an apply request (objects up to 1 MiB each).
const maxApplyBytes = 8 << 20

// Handler is the operator's API on b.
func Handler(b Backend) http.Handler {
	s := &server{b: b}
	mux := http.NewServeMux()
	handle := func(r api.Route, h http.HandlerFunc) { mux.HandleFunc(r.String(), h) }
	handle(api.RouteVersion, func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, http.StatusOK, b.Info.Version()) })
	handle(api.RouteApply, s.apply)
	handle(api.RouteObjects, s.list)
	handle(api.RouteObject, s.get)
	handle(api.RouteDeleteObject, s.delete)
	handle(api.RouteScale, s.scale)
	handle(api.RouteRelease, s.release)
	handle(api.RouteReplicas, func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, api.ReplicaList{Items: nonNil(b.Info.Replicas())})
	})
	handle(api.RouteNodes, func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, api.NodeList{Items: nonNil(b.Info.Nodes())})
	})
	handle(api.RouteForgetNode, func(w http.ResponseWriter, r *http.Request) {
		answer(w, http.StatusOK)(b.Info.Forget(r.Context(), r.PathValue("name")))
	})
	handle(api.RouteJoinTokens, s.joinToken)
	handle(api.RouteClientConfig, func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, http.StatusOK, b.Admin.ClientConfig()) })
	handle(api.RouteRotateKeys, func(w http.ResponseWriter, r *http.Request) {
		answer(w, http.StatusOK)(b.Admin.RotateKeys(r.Context()))
	})
	handle(api.RouteLogs, s.logs)
	handle(api.RouteDNSLookup, s.dnsLookup)
	handle(api.RouteImportImages, s.importImages)
	handle(api.RouteImages, func(w http.ResponseWriter, r *http.Request) {
		imgs, err := b.Images.List(r.Context())
		answer(w, http.StatusOK)(api.ImageList{Items: nonNil(imgs)}, err)
	})
	handle(api.RouteImageBlob, s.blob)
	handle(api.RouteRollout, s.rolloutStatus)
	handle(api.RouteHistory, s.rolloutHistory)
	handle(api.RouteUndo, s.rollout(RolloutUndo))
	handle(api.RouteRestart, s.rollout(RolloutRestart))
	handle(api.RoutePause, s.rollout(RolloutPause))
	handle(api.RouteResume, s.rollout(RolloutResume))
	mux.Handle(api.RouteMetrics.String(), b.Metrics)
	return mux
}

type server struct{ b Backend }

// WriteJSON answers with status and v as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	writeBody(w, v)
}

// WriteError answers with err: its own Status when it is an API error
// (api.NewError, apierrors), else a 500 with err's message.
func WriteError(w http.ResponseWriter, err error) {
	code, body := api.ErrorBody(err)
	WriteJSON(w, code, body)
}

// answer writes v with status, or err: answer(w, code)(call()).
func answer(w http.ResponseWriter, status int) func(v any, err error) {
	return func(v any, err error) {
		if err != nil {
			WriteError(w, err)
			return
		}
		WriteJSON(w, status, v)
	}
}

// dnsLookup answers a name looked up as a pod would (DNS).
func (s *server) dnsLookup(w http.ResponseWriter, r *http.Request) {
	s.lookup(w, r, api.DNSQueryOf(r.URL.Query()))
}

// lookup checks q and answers it (DNS). Every field is checked, a
// peer's query as an operator's.
func (s *server) lookup(w http.ResponseWriter, r *http.Request, q api.DNSQuery) {
	switch {
	case s.b.DNS == nil:
		WriteError(w, api.Errorf(http.StatusServiceUnavailable, "node %s serves no cluster DNS (--cluster-dns=false, or its pod network is not up)", s.b.Node))
		return
	case q.Name == "" || len(q.Name) > 253:
		WriteError(w, api.Errorf(http.StatusBadRequest, "name: give a DNS name of at most 253 characters"))
		return
	case !slices.Contains([]string{"A", "AAAA", "SRV", "CNAME", "PTR", "TXT", "MX"}, q.Type):
		WriteError(w, api.Errorf(http.StatusBadRequest, "type %q: give A, AAAA, SRV, CNAME, PTR, TXT or MX", q.Type))
		return
	case q.Node != "" && len(validation.IsDNS1123Label(q.Node)) > 0:
		WriteError(w, api.Errorf(http.StatusBadRequest, "node %q: not a node name", api.OneLine(q.Node)))
		return
	}
	if err := CheckRef(q.Namespace, cmp.Or(q.From, "x")); err != nil {
		WriteError(w, api.Errorf(http.StatusBadRequest, "namespace or replica: %v", err))
		return
	}
	answer(w, http.StatusOK)(s.b.DNS.Lookup(r.Context(), q))
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// CheckRef refuses a namespace or name that is not a Kubernetes name:
// they become file names (logs) and store keys, so "../" must never get
// through. The error is a 400.
func CheckRef(namespace, name string) error {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return api.Errorf(http.StatusBadRequest, "namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return api.Errorf(http.StatusBadRequest, "name %q: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// ref is the kind (from the path, or kind), namespace and name of r.
func ref(r *http.Request, kind string) (string, string, string, error) {
	if kind == "" {
		kind = r.PathValue("kind")
	}
	k, err := manifest.KindOf(kind)
	if err != nil {
		return "", "", "", api.NewError(http.StatusBadRequest, err)
	}
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	return k, ns, name, CheckRef(ns, name)
}

func (s *server) apply(w http.ResponseWriter, r *http.Request) {
	var req api.ApplyRequest
	if err := ReadJSON(w, r, "apply", maxApplyBytes, &req); err != nil {
		if apierrors.IsRequestEntityTooLargeError(err) {
			err = api.Errorf(http.StatusRequestEntityTooLarge, "%v; an object may be at most %s: apply fewer objects at a time", err, humanize.IBytes(api.MaxObjectBytes))
		}
		WriteError(w, err)
		return
	}
	// Validate everything first: a bad object changes nothing stored.
	objs := make([]manifest.Object, 0, len(req.Objects))
	var errs []error
	for i, raw := range req.Objects {
		o, err := manifest.Decode(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("object %d: %w", i, err))
			continue
		}
		objs = append(objs, o)
	}
	if len(errs) > 0 {
		WriteError(w, api.NewError(http.StatusUnprocessableEntity, errors.Join(errs...)))
		return
	}
	results, err := s.b.Objects.Apply(objs)
	answer(w, http.StatusOK)(api.ApplyResponse{Results: results}, err)
}

func (s *server) list(w http.ResponseWriter, r *http.Request) {
	kind, err := manifest.KindOf(r.PathValue("kind"))
	if err != nil {
		WriteError(w, api.NewError(http.StatusBadRequest, err))
		return
	}
	items, err := s.b.Objects.List(kind)
	items = Redact(kind, items) // values: one named Secret at a time (get)
	answer(w, http.StatusOK)(api.ObjectList{Items: nonNil(items)}, err)
}

func (s *server) get(w http.ResponseWriter, r *http.Request) {
	kind, ns, name, err := ref(r, "")
	if err != nil {
		WriteError(w, err)
		return
	}
	obj, err := s.b.Objects.Get(kind, ns, name)
	switch {
	case err == nil && !reveal(r):
		obj = Redact(kind, []api.Object{obj})[0]
	case err == nil && kind == manifest.KindSecret && s.b.Log != nil:
		// An audit line: who asked for a Secret's values (the token holder
		// over TCP, root on the node over the socket), never the values.
		s.b.Log.Info("a Secret's values were revealed", "secret", ns+"/"+name, "client", cmp.Or(r.RemoteAddr, "the unix socket"))
	}
	answer(w, http.StatusOK)(obj, err)
}

// reveal reports whether r asks for Secret values (revealParam).
func reveal(r *http.Request) bool { return r.URL.Query().Get(revealParam) == "true" }

func (s *server) delete(w http.ResponseWriter, r *http.Request) {
	kind, ns, name, err := ref(r, "")
	if err != nil {
		WriteError(w, err)
		return
	}
	answer(w, http.StatusOK)(s.b.Objects.Delete(kind, ns, name))
}

func (s *server) scale(w http.ResponseWriter, r *http.Request) {
	var req api.ScaleRequest
	if err := ReadJSON(w, r, "scale", 4096, &req); err != nil {
		WriteError(w, err)
		return
	}
	// ?kind=statefulset scales a StatefulSet; the default is a Deployment.
	kind := r.URL.Query().Get("kind")
	if kind == "" {
		kind = "deployment"
	}
	kind, ns, name, err := ref(r, kind)
	if err != nil {
		WriteError(w, err)
		return
	}
	answer(w, http.StatusOK)(s.b.Objects.Scale(kind, ns, name, req.Replicas))
}

func (s *server) release(w http.ResponseWriter, r *http.Request) {
	_, ns, name, err := ref(r, "pvc")
	if err != nil {
		WriteError(w, err)
		return
	}
	answer(w, http.StatusOK)(s.b.Objects.ReleaseClaim(ns, name))
}

func (s *server) joinToken(w http.ResponseWriter, r *http.Request) {
	var req api.JoinTokenRequest
	if err := ReadJSON(w, r, "join-token request", 4<<10, &req); err != nil {
		WriteError(w, err)
		return
	}
	answer(w, http.StatusCreated)(s.b.Admin.JoinToken(req))
}

// logs streams a replica's log (the kubelet's container log options).
func (s *server) logs(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	if err := CheckRef(ns, name); err != nil {
		WriteError(w, err)
		return
	}
	o, err := api.ParseLogOptions(r.URL.Query())
	if err != nil {
		WriteError(w, api.NewError(http.StatusBadRequest, err))
		return
	}
	s.b.Logs.ServeLogs(w, r, ns, name, o)
}

// blob serves blob {digest} of this node's content store (a manifest,
// config or layer), for peers pulling an image: content-addressed, so
// the puller checks what it gets against the digest it asked for.
func (s *server) blob(w http.ResponseWriter, r *http.Request) {
	ServeBlob(w, r, s.b.Node, s.b.Images)
}

// ServeBlob answers GET /v1/images/blobs/{digest} from images.
func ServeBlob(w http.ResponseWriter, r *http.Request, node string, images Images) {
	d, err := digest.Parse(r.PathValue("digest"))
	if err != nil {
		WriteError(w, api.Errorf(http.StatusBadRequest, "digest: %v (want sha256:<64 hex digits>)", err))
		return
	}
	started := false
	err = images.WriteBlob(r.Context(), d, func(size int64) {
		started = true
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}, w)
	switch {
	case err == nil:
	case !started && errdefs.IsNotFound(err):
		WriteError(w, api.Errorf(http.StatusNotFound, "node %s holds no blob %s", node, d))
	case !started:
		WriteError(w, err)
	}
}

func (s *server) rolloutStatus(w http.ResponseWriter, r *http.Request) {
	_, ns, name, err := ref(r, "deployment")
	if err != nil {
		WriteError(w, err)
		return
	}
	answer(w, http.StatusOK)(s.b.Objects.RolloutStatus(ns, name))
}

func (s *server) rolloutHistory(w http.ResponseWriter, r *http.Request) {
	_, ns, name, err := ref(r, "deployment")
	if err != nil {
		WriteError(w, err)
		return
	}
	revs, err := s.b.Objects.RolloutHistory(ns, name)
	answer(w, http.StatusOK)(api.RevisionList{Items: nonNil(revs)}, err)
}

func (s *server) rollout(cmd RolloutCommand) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req api.UndoRequest
		if cmd == RolloutUndo {
			if err := ReadJSON(w, r, "undo", 4096, &req); err != nil {
				WriteError(w, err)
				return
			}
			if req.ToRevision < 0 {
				WriteError(w, api.Errorf(http.StatusBadRequest, "toRevision %d: must be 0 (the previous revision) or a revision number", req.ToRevision))
				return
			}
		}
		_, ns, name, err := ref(r, "deployment")
		if err != nil {
			WriteError(w, err)
			return
		}
		answer(w, http.StatusOK)(s.b.Objects.Rollout(cmd, ns, name, req.ToRevision))
	}
}
