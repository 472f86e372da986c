package node

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/dustin/go-humanize"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// Version is the agent's version, set at build time with
// -ldflags "-X github.com/starling-orchestrator/starling/node.Version=...".
var Version = "dev"

// maxApplyBytes bounds an apply request (objects up to 1 MiB each).
const maxApplyBytes = 8 << 20

func (a *Agent) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.Version{Version: Version, Node: a.cfg.Name})
	})
	mux.HandleFunc("POST /v1/apply", a.handleApply)
	mux.HandleFunc("GET /v1/objects/{kind}", a.handleList)
	mux.HandleFunc("GET /v1/objects/{kind}/{namespace}/{name}", a.handleGet)
	mux.HandleFunc("DELETE /v1/objects/{kind}/{namespace}/{name}", a.handleDelete)
	mux.HandleFunc("POST /v1/scale/{namespace}/{name}", a.handleScale)
	mux.HandleFunc("GET /v1/replicas", a.handleReplicas)
	mux.HandleFunc("GET /v1/nodes", a.handleNodes)
	mux.HandleFunc("DELETE /v1/nodes/{name}", a.handleForgetNode)
	mux.HandleFunc("POST /v1/join-tokens", a.join.handleToken)
	mux.HandleFunc("GET /v1/client-config", a.handleClientConfig)
	mux.HandleFunc("POST /v1/keys/rotate", a.keys.handleRotate)
	mux.HandleFunc("GET /v1/logs/{namespace}/{name}", a.handleLogs)
	mux.HandleFunc("POST /v1/images", a.handleImageImport)
	mux.HandleFunc("GET /v1/images", a.handleImages)
	mux.HandleFunc("GET /v1/images/blobs/{digest}", a.handleImageBlob)
	mux.HandleFunc("GET /v1/rollout/{namespace}/{name}/status", a.handleRolloutStatus)
	mux.HandleFunc("GET /v1/rollout/{namespace}/{name}/history", a.handleRolloutHistory)
	mux.HandleFunc("POST /v1/rollout/{namespace}/{name}/undo", a.handleRolloutUndo)
	mux.HandleFunc("POST /v1/rollout/{namespace}/{name}/restart", a.handleRolloutRestart)
	mux.HandleFunc("POST /v1/rollout/{namespace}/{name}/pause", a.handleRolloutPause)
	mux.HandleFunc("POST /v1/rollout/{namespace}/{name}/resume", a.handleRolloutResume)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{}))
	return mux
}

// constantTimeEqual compares secrets without leaking where they differ.
func constantTimeEqual(a, b []byte) bool { return subtle.ConstantTimeCompare(a, b) == 1 }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeError answers with err: its own Status when it is an API error
// (api.NewError, apierrors), else status with err's message.
func writeError(w http.ResponseWriter, status int, err error) {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		err = api.NewError(status, err)
	}
	code, body := api.ErrorBody(err)
	writeJSON(w, code, body)
}

// kindOf maps a path segment to a manifest kind (manifest.KindOf).
var kindOf = manifest.KindOf

func (a *Agent) handleApply(w http.ResponseWriter, r *http.Request) {
	var req api.ApplyRequest
	b, err := readBody(w, r, maxApplyBytes)
	if err != nil {
		status, err := bodyStatus("apply", err)
		if status == http.StatusRequestEntityTooLarge {
			err = fmt.Errorf("%w; an object may be at most %s: apply fewer objects at a time", err, humanize.IBytes(MaxObjectBytes))
		}
		writeError(w, status, err)
		return
	}
	if err := json.Unmarshal(b, &req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("apply: request body: %w", err))
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
		writeError(w, http.StatusUnprocessableEntity, errors.Join(errs...))
		return
	}
	if err := a.workloadClash(objs); err != nil {
		writeError(w, http.StatusConflict, err)
		return
	}
	if err := a.admit(objs); err != nil {
		writeError(w, http.StatusUnprocessableEntity, err)
		return
	}
	results, err := a.applyObjects(objs)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ApplyResponse{Results: results})
}

// publish signs records with this node's key, writes them to the local
// store (durably) and gossips them. The objects were validated before, so
// an error here is an I/O failure.
func (a *Agent) publish(recs ...crdt.Record) error {
	for _, r := range recs {
		r, err := a.id.sign(r)
		if err != nil {
			return fmt.Errorf("sign %s: %w", r.Key, err)
		}
		if err := a.cluster.Publish(r); err != nil {
			return fmt.Errorf("store and gossip %s: %w", r.Key, err)
		}
	}
	return nil
}

// applyObjects stores objects as new versions and gossips them.
// An object identical to the stored one is left alone ("unchanged"); a
// new object gets a creationTimestamp, an update keeps the stored one.
// A Deployment's revision records follow its template (rollout.Record),
// unchanged ones too (which records a Deployment stored before revisions
// existed); they are written before the objects, so a node that sees a
// new template has mostly seen its revision already.
func (a *Agent) applyObjects(objs []manifest.Object) ([]api.ApplyResult, error) {
	var recs, revRecs []crdt.Record
	results := make([]api.ApplyResult, len(objs))
	for i, o := range objs {
		results[i] = api.ApplyResult{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name, Result: "created"}
		old, found, err := a.store.Get(o.Key())
		if err != nil {
			return nil, err
		}
		if found {
			a.clock.Update(old.Version) // the new version must win over the old
		}
		if o.Deployment != nil {
			rs, err := a.revisionChanges(o.Deployment)
			if err != nil {
				return nil, fmt.Errorf("revisions of %s: %w", o.Key(), err)
			}
			revRecs = append(revRecs, rs...)
		}
		// uid and creationTimestamp are kept from the stored object (an
		// object stored before Starling gave UIDs keeps none: a new one
		// would rename its replicas); generation counts changes of the
		// object, as in Kubernetes.
		meta := objectMeta(&o)
		meta.CreationTimestamp, meta.Generation, meta.UID = metav1.Time{}, 0, ""
		created := true
		if found && !old.Deleted {
			created = false
			if prev, err := manifest.Decode(old.Value); err == nil {
				pm := objectMeta(&prev)
				meta.CreationTimestamp, meta.Generation, meta.UID = pm.CreationTimestamp, pm.Generation, pm.UID
			}
			same, err := manifest.Encode(o)
			if err != nil {
				return nil, err
			}
			if bytes.Equal(old.Value, same) {
				results[i].Result = "unchanged"
				continue
			}
			results[i].Result = "configured"
		}
		if meta.CreationTimestamp.IsZero() {
			meta.CreationTimestamp = metav1.NewTime(time.Now().UTC().Truncate(time.Second))
		}
		if created {
			// A new object, also one applied again after a delete: its
			// replicas are not its predecessor's (reconcile.NewReplica).
			meta.UID = uuid.NewUUID()
		}
		meta.Generation++
		value, err := manifest.Encode(o)
		if err != nil {
			return nil, err
		}
		recs = append(recs, crdt.Record{Key: o.Key(), Value: value, Version: a.clock.Now(), Origin: a.cfg.Name})
	}
	if err := a.publish(append(revRecs, recs...)...); err != nil {
		return nil, err
	}
	// Read your writes: reads through this node after the answer see the
	// change (the view loop would take up to its debounce).
	a.rebuildView(time.Now())
	return results, nil
}

func objectMeta(o *manifest.Object) *metav1.ObjectMeta {
	switch {
	case o.Deployment != nil:
		return &o.Deployment.ObjectMeta
	case o.StatefulSet != nil:
		return &o.StatefulSet.ObjectMeta
	}
	return &o.Service.ObjectMeta
}

// workloadClash refuses a Deployment and a StatefulSet of one name in one
// namespace: their replicas would share the workload's ordinals.
func (a *Agent) workloadClash(objs []manifest.Object) error {
	var errs []error
	for _, o := range objs {
		other := ""
		switch o.Kind {
		case manifest.KindDeployment:
			other = manifest.KindStatefulSet
		case manifest.KindStatefulSet:
			other = manifest.KindDeployment
		default:
			continue
		}
		rec, found, err := a.store.Get(manifest.KeyFor(other, o.Namespace, o.Name))
		if err != nil {
			return err
		}
		if found && !rec.Deleted {
			errs = append(errs, fmt.Errorf("%s %s/%s: metadata.name: a %s of that name exists in the namespace; delete it first or choose another name",
				o.Kind, o.Namespace, o.Name, other))
		}
	}
	return errors.Join(errs...)
}

func (a *Agent) handleList(w http.ResponseWriter, r *http.Request) {
	kind, err := kindOf(r.PathValue("kind"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	recs, err := a.store.List(kindPrefix(kind))
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	out := api.ObjectList{Items: []api.Object{}}
	for _, rec := range recs {
		if !rec.Deleted {
			out.Items = append(out.Items, apiObject(rec))
		}
	}
	if kind == manifest.KindService {
		a.decorateServices(out.Items)
	}
	writeJSON(w, http.StatusOK, out)
}

// apiObject is a stored object as the API shows it, with who wrote it:
// the node that accepted the write, and the key its signature verified
// with (checked on arrival; this node's own key for its own writes).
func apiObject(rec crdt.Record) api.Object {
	return api.Object{Object: rec.Value, Version: rec.Version.String(), Origin: rec.Origin, Signer: keyID(rec.Signer)}
}

// checkRef refuses a namespace or name that is not a Kubernetes name: they
// become file names (logs) and store keys, so "../" must never get through.
func checkRef(namespace, name string) error {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("name %q: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// lookup returns the live record at the request's kind/namespace/name.
func (a *Agent) lookup(r *http.Request) (crdt.Record, int, error) {
	kind, err := kindOf(r.PathValue("kind"))
	if err != nil {
		return crdt.Record{}, http.StatusBadRequest, err
	}
	if err := checkRef(r.PathValue("namespace"), r.PathValue("name")); err != nil {
		return crdt.Record{}, http.StatusBadRequest, err
	}
	key := manifest.KeyFor(kind, r.PathValue("namespace"), r.PathValue("name"))
	rec, found, err := a.store.Get(key)
	if err != nil {
		return rec, http.StatusInternalServerError, err
	}
	if !found || rec.Deleted {
		return rec, http.StatusNotFound, fmt.Errorf("%s %q not found in namespace %q", strings.ToLower(kind), r.PathValue("name"), r.PathValue("namespace"))
	}
	return rec, http.StatusOK, nil
}

func (a *Agent) handleGet(w http.ResponseWriter, r *http.Request) {
	rec, status, err := a.lookup(r)
	if err != nil {
		writeError(w, status, err)
		return
	}
	items := []api.Object{apiObject(rec)}
	if strings.HasPrefix(rec.Key, kindPrefix(manifest.KindService)) {
		a.decorateServices(items)
	}
	writeJSON(w, http.StatusOK, items[0])
}

func (a *Agent) handleDelete(w http.ResponseWriter, r *http.Request) {
	rec, status, err := a.lookup(r)
	if err != nil {
		writeError(w, status, err)
		return
	}
	kind, _ := kindOf(r.PathValue("kind"))
	a.clock.Update(rec.Version) // the tombstone must win over what it deletes
	tomb := crdt.Record{Key: rec.Key, Version: a.clock.Now(), Origin: a.cfg.Name, Deleted: true}
	if err := a.publish(tomb); err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("store: %w", err))
		return
	}
	a.rebuildView(time.Now()) // read your writes, as applyObjects
	if kind == manifest.KindDeployment {
		if err := a.deleteRevisions(r.PathValue("namespace"), r.PathValue("name")); err != nil {
			writeError(w, http.StatusInternalServerError, fmt.Errorf("delete revisions: %w", err))
			return
		}
	}
	writeJSON(w, http.StatusOK, api.ApplyResult{Kind: kind, Namespace: r.PathValue("namespace"), Name: r.PathValue("name"), Result: "deleted"})
}

func (a *Agent) handleScale(w http.ResponseWriter, r *http.Request) {
	var req api.ScaleRequest
	b, err := readBody(w, r, 4096)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("scale: request body: %w", err))
		return
	}
	if err := json.Unmarshal(b, &req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("scale: request body: %w", err))
		return
	}
	// ?kind=statefulset scales a StatefulSet; the default is a Deployment.
	kind := "deployment"
	if k := r.URL.Query().Get("kind"); k != "" {
		kind = k
	}
	r.SetPathValue("kind", kind)
	rec, status, err := a.lookup(r)
	if err != nil {
		writeError(w, status, err)
		return
	}
	o, err := manifest.Decode(rec.Value)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	switch {
	case o.Deployment != nil:
		o.Deployment.Spec.Replicas = &req.Replicas
	case o.StatefulSet != nil:
		o.StatefulSet.Spec.Replicas = &req.Replicas
	default:
		writeError(w, http.StatusBadRequest, fmt.Errorf("scale: %s is not a Deployment or StatefulSet", o.Key()))
		return
	}
	if errs := manifest.Validate(o); len(errs) > 0 {
		writeError(w, http.StatusUnprocessableEntity, errs.ToAggregate())
		return
	}
	if _, err := a.applyObjects([]manifest.Object{o}); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ApplyResult{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name, Result: "scaled"})
}

// localReplicas is the status of the replicas on this node: every
// container (Terminating when this node no longer runs it) and every
// replica it owns that has no container yet (Pending or ContainerCreating).
func (a *Agent) localReplicas(observed []reconcile.Container, mine []reconcile.Replica, probes map[string]probe.Probes) []api.Replica {
	now := time.Now()
	want := map[string]bool{}
	for _, d := range mine {
		want[d.ID] = true
	}
	seen := map[string]bool{}
	slots := map[string]bool{}
	items := []api.Replica{}
	for _, c := range observed {
		seen[c.ID] = true
		slots[slotOf(c.Namespace, c.Workload, c.Ordinal)] = true
		item := api.Replica{Name: c.Name, Namespace: c.Namespace, Workload: c.Workload, Ordinal: c.Ordinal,
			Node: a.cfg.Name, PodIP: c.PodIP, SpecHash: c.SpecHash, Restarts: c.Restarts, Started: c.StartedAt.UTC(), Created: c.CreatedAt.UTC(),
			LastState: apiTermination(c.Last)}
		if c.State == reconcile.StateExited {
			t := reconcile.Terminated(c.ExitCode, c.OOMKilled, c.StartedAt, c.ExitedAt)
			item.Exit = apiTermination(&t)
		}
		if msg, failed := a.acts.lastFailure(c.ID); failed {
			item.Reason = msg
		}
		busy, isBusy := a.acts.busyAction(c.ID)
		switch {
		case !want[c.ID] || isBusy && (busy == reconcile.Remove || busy == reconcile.Replace):
			item.Phase = api.PhaseTerminating
		case c.State == reconcile.StateRunning:
			var why string
			item.Phase = api.PhaseRunning
			item.Ready, why = a.ready(c, probes)
			if item.Reason == "" {
				item.Reason = why
			}
		case c.State == reconcile.StateExited && now.Sub(c.ExitedAt) < reconcile.Backoff(c.BackoffStep):
			item.Phase = api.PhaseCrashLoopBackOff
			if item.Reason == "" {
				item.Reason = c.StopReason
			}
		case c.State == reconcile.StateExited:
			item.Phase = api.PhaseExited
			if item.Reason == "" {
				item.Reason = c.StopReason
			}
		case c.State == reconcile.StateCreated:
			item.Phase = api.PhaseContainerCreating
		default:
			item.Phase = api.PhaseUnknown
		}
		items = append(items, item)
	}
	for _, d := range mine {
		if seen[d.ID] {
			continue
		}
		item := api.Replica{Name: d.Name, Namespace: d.Namespace, Workload: d.Workload, Ordinal: d.Ordinal,
			Node: a.cfg.Name, SpecHash: d.SpecHash, Phase: api.PhasePending}
		if msg, failed := a.acts.lastFailure(d.ID); failed {
			item.Phase, item.Reason = api.PhaseCreateBackOff, msg
		}
		if t, busy := a.acts.busyAction(d.ID); busy {
			item.Phase, item.Reason = api.PhaseContainerCreating, a.rt.ImageProgress(d.Spec.Image)
			if t == reconcile.Replace && slots[slotOf(d.Namespace, d.Workload, d.Ordinal)] {
				// A Replace stops the old copy first.
				item.Phase, item.Reason = api.PhasePending, "waiting for the old copy to stop"
			}
		}
		items = append(items, item)
	}
	sortReplicas(items)
	return items
}

// slotOf names a workload's ordinal: "namespace/workload/ordinal".
func slotOf(namespace, workload string, ordinal int) string {
	return namespace + "/" + workload + "/" + strconv.Itoa(ordinal)
}

func sortReplicas(items []api.Replica) {
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

// replicaView is the whole cluster's replicas as this node sees them: its
// own, live observation, the others' from their gossiped status records
// (dead and left nodes do not count), and desired replicas that no node
// reports yet (Pending, with the node placement gave them).
//
// It reads only the snapshot and the list of this node's replicas its last
// reconcile pass published (Agent.local): no lock, no call to containerd.
func (a *Agent) replicaView() []api.Replica {
	v := a.view()
	var items []api.Replica
	if p := a.local.Load(); p != nil {
		items = slices.Clone(*p)
	} else if s, ok := v.statuses[a.cfg.Name]; ok {
		items = slices.Clone(s.Replicas) // no pass yet: what it last said
	}
	reported := map[string]bool{}
	for _, r := range items {
		reported[r.Namespace+"/"+r.Name] = true
	}
	for name, s := range v.statuses {
		if name == a.cfg.Name || !v.alive[name] {
			continue
		}
		for _, r := range s.Replicas {
			items = append(items, r)
			reported[r.Namespace+"/"+r.Name] = true
		}
	}
	for _, d := range v.all {
		if reported[d.Namespace+"/"+d.Name] {
			continue
		}
		item := api.Replica{Name: d.Name, Namespace: d.Namespace, Workload: d.Workload, Ordinal: d.Ordinal,
			Node: v.owner[d.ID], SpecHash: d.SpecHash, Phase: api.PhasePending}
		if item.Node == "" {
			item.Reason = v.placement.Pending[workloadKey(d.Namespace, d.Workload)][d.Ordinal]
		}
		items = append(items, item)
	}
	sortReplicas(items)
	return items
}

func (a *Agent) handleReplicas(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.ReplicaList{Items: a.replicaView()})
}

func (a *Agent) handleNodes(w http.ResponseWriter, r *http.Request) {
	v := a.view()
	out := api.NodeList{Items: []api.Node{}}
	for _, m := range a.cluster.Members() {
		n := api.Node{Name: m.Name, State: string(m.State), Address: m.Addr, Unresponsive: v.excluded[m.Name]}
		if s, ok := v.statuses[m.Name]; ok {
			n.PodSubnet, n.Started, n.API, n.Ready, n.Insecure = s.PodSubnet, s.Started, s.API, s.SubnetReady, s.Insecure
			for _, rep := range s.Replicas {
				if rep.Phase != api.PhaseTerminating {
					n.Replicas++
				}
			}
		}
		if rtt, ok := a.cluster.RTT(m.Name); ok && m.Name != a.cfg.Name {
			n.RTT = rtt.Round(10 * time.Microsecond).String()
		}
		out.Items = append(out.Items, n)
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *Agent) handleImages(w http.ResponseWriter, r *http.Request) {
	imgs, err := a.rt.Images(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ImageList{Items: append([]api.Image{}, imgs...)})
}

// peerAPIClient calls other agents' APIs. No overall timeout (logs and
// images stream), but a peer that does not connect or answer in time is
// given up on.
var peerAPIClient = &http.Client{Transport: &http.Transport{
	DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
	ResponseHeaderTimeout: 30 * time.Second,
	IdleConnTimeout:       90 * time.Second,
}}

// peerAPI returns the API URL of a live peer, trusting the URL its status
// record gossips only when its host is the address membership knows the
// peer by: holding the gossip key must not be enough to make this node
// send its token, or proxy requests, somewhere else.
func (a *Agent) peerAPI(name string, s NodeStatus) (string, bool) {
	if s.API == "" {
		return "", false
	}
	u, err := url.Parse(s.API)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" {
		return "", false
	}
	for _, m := range a.cluster.Members() {
		if m.Name == name {
			return s.API, u.Hostname() == m.Addr
		}
	}
	return "", false
}

// proxiedHeader marks a request one agent forwards to another, so it is
// never forwarded twice.
const proxiedHeader = "X-Starling-Proxied-By"

// proxyLogs forwards a logs request to the live node whose status lists
// the replica (httputil.ReverseProxy: streamed, flushed as it comes,
// hop-by-hop headers handled), authenticated as this node (peerEndpoint),
// never with the operator's token. It reports whether it answered the
// client.
func (a *Agent) proxyLogs(w http.ResponseWriter, r *http.Request) bool {
	v := a.view()
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	for node, s := range v.statuses {
		if node == a.cfg.Name || !v.alive[node] {
			continue
		}
		if !slices.ContainsFunc(s.Replicas, func(rep api.Replica) bool { return rep.Namespace == ns && rep.Name == name }) {
			continue
		}
		fail := func(w http.ResponseWriter, err error) {
			writeError(w, http.StatusBadGateway, fmt.Errorf("logs of replica %s from node %s: %w", name, node, err))
		}
		base, rt, prepare, err := a.peerEndpoint(node, s)
		if err != nil {
			fail(w, err)
			return true
		}
		proxy := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(base)
				prepare(pr.Out)
			},
			Transport:     rt,
			FlushInterval: -1, // logs -f: every write at once
			ErrorHandler:  func(w http.ResponseWriter, _ *http.Request, err error) { fail(w, err) },
		}
		proxy.ServeHTTP(w, r)
		return true
	}
	return false
}

// handleForgetNode deletes the record of a node that is dead or left, so
// its subnet is free at once instead of after --subnet-reclaim-after.
func (a *Agent) handleForgetNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	for _, m := range a.cluster.Members() {
		if m.Name == name && (m.State.Up()) {
			writeError(w, http.StatusConflict, fmt.Errorf("node %s is %s: only a dead or departed node can be forgotten", name, m.State))
			return
		}
	}
	if name == a.cfg.Name {
		writeError(w, http.StatusConflict, fmt.Errorf("node %s is this node", name))
		return
	}
	if _, ok, err := a.store.Get(statusKey(name)); err != nil || !ok {
		writeError(w, http.StatusNotFound, fmt.Errorf("node %q is not known", name))
		return
	}
	revoked, err := a.forgetNode(name)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	res := api.ForgetResult{Name: name}
	if revoked != nil {
		res.RevokedKey = gossipKeyID(revoked)
	}
	// The forgotten node still holds the gossip key (and, like every
	// node, the CA key: it could mint itself a new identity). A rotation
	// shuts it out of gossip; every member installs the new key only once
	// it holds the revocation, so none hands the key on to it.
	if a.keys != nil && revoked != nil {
		rot, err := a.keys.rotate(r.Context(), revoked)
		res.Rotation = &rot
		if err != nil {
			res.RotationError = err.Error()
			a.log.Warn("node forgotten, but the gossip key rotation that shuts it out did not finish; run 'starling keys rotate'", "node", name, "err", err)
		}
	}
	writeJSON(w, http.StatusOK, res)
}

// apiTermination is t as the API shows it (nil for nil).
func apiTermination(t *reconcile.Termination) *api.Termination {
	if t == nil {
		return nil
	}
	return &api.Termination{ExitCode: t.ExitCode, Signal: t.Signal, Reason: t.Reason, StartedAt: t.StartedAt.UTC(), FinishedAt: t.FinishedAt.UTC()}
}
