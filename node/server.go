package node

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
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
	mux.HandleFunc("GET /v1/logs/{namespace}/{name}", a.handleLogs)
	mux.HandleFunc("POST /v1/images", a.handleImageImport)
	mux.HandleFunc("GET /v1/images", a.handleImages)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{}))
	return mux
}

// requireToken guards the TCP API with the bearer token from --token-file.
func (a *Agent) requireToken(next http.Handler) http.Handler {
	want := []byte("Bearer " + a.token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			writeError(w, http.StatusUnauthorized, errors.New("missing or wrong bearer token (pass --token or set STARLING_TOKEN)"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, api.Error{Error: err.Error()})
}

// kindOf maps a path segment ("deployment", "deployments", "deploy",
// "service", "svc", ...) to a manifest kind.
func kindOf(s string) (string, error) {
	switch strings.ToLower(s) {
	case "deployment", "deployments", "deploy":
		return manifest.KindDeployment, nil
	case "service", "services", "svc":
		return manifest.KindService, nil
	}
	return "", fmt.Errorf("unknown kind %q: use deployment or service", s)
}

func (a *Agent) handleApply(w http.ResponseWriter, r *http.Request) {
	var req api.ApplyRequest
	body := http.MaxBytesReader(w, r.Body, maxApplyBytes)
	if err := json.NewDecoder(body).Decode(&req); err != nil {
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
	results, err := a.applyObjects(objs)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ApplyResponse{Results: results})
}

// applyObjects stores objects as new versions, all in one transaction.
// An object identical to the stored one is left alone ("unchanged"); a
// new object gets a creationTimestamp, an update keeps the stored one.
func (a *Agent) applyObjects(objs []manifest.Object) ([]api.ApplyResult, error) {
	var recs []crdt.Record
	results := make([]api.ApplyResult, len(objs))
	for i, o := range objs {
		results[i] = api.ApplyResult{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name, Result: "created"}
		old, found, err := a.store.Get(o.Key())
		if err != nil {
			return nil, err
		}
		meta := objectMeta(&o)
		meta.CreationTimestamp = metav1.Time{}
		if found && !old.Deleted {
			results[i].Result = "configured"
			if prev, err := manifest.Decode(old.Value); err == nil {
				meta.CreationTimestamp = objectMeta(&prev).CreationTimestamp
			}
		}
		if meta.CreationTimestamp.IsZero() {
			meta.CreationTimestamp = metav1.NewTime(time.Now().UTC().Truncate(time.Second))
		}
		value, err := manifest.Encode(o)
		if err != nil {
			return nil, err
		}
		if found && !old.Deleted && bytes.Equal(old.Value, value) {
			results[i].Result = "unchanged"
			continue
		}
		recs = append(recs, crdt.Record{Key: o.Key(), Value: value, Version: a.clock.Now(), Origin: a.cfg.Name})
	}
	if len(recs) > 0 {
		if _, err := a.store.ApplyAll(recs); err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
	}
	return results, nil
}

func objectMeta(o *manifest.Object) *metav1.ObjectMeta {
	if o.Deployment != nil {
		return &o.Deployment.ObjectMeta
	}
	return &o.Service.ObjectMeta
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
			out.Items = append(out.Items, api.Object{Object: rec.Value, Version: rec.Version.String(), Origin: rec.Origin})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// lookup returns the live record at the request's kind/namespace/name.
func (a *Agent) lookup(r *http.Request) (crdt.Record, int, error) {
	kind, err := kindOf(r.PathValue("kind"))
	if err != nil {
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
	writeJSON(w, http.StatusOK, api.Object{Object: rec.Value, Version: rec.Version.String(), Origin: rec.Origin})
}

func (a *Agent) handleDelete(w http.ResponseWriter, r *http.Request) {
	rec, status, err := a.lookup(r)
	if err != nil {
		writeError(w, status, err)
		return
	}
	kind, _ := kindOf(r.PathValue("kind"))
	tomb := crdt.Record{Key: rec.Key, Version: a.clock.Now(), Origin: a.cfg.Name, Deleted: true}
	if _, err := a.store.Apply(tomb); err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("store: %w", err))
		return
	}
	writeJSON(w, http.StatusOK, api.ApplyResult{Kind: kind, Namespace: r.PathValue("namespace"), Name: r.PathValue("name"), Result: "deleted"})
}

func (a *Agent) handleScale(w http.ResponseWriter, r *http.Request) {
	var req api.ScaleRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("scale: request body: %w", err))
		return
	}
	r.SetPathValue("kind", "deployment")
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
	o.Deployment.Spec.Replicas = &req.Replicas
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

// replicaView merges desired replicas and observed containers into what
// users see: every desired replica (Pending until it has a container) and
// every container still present (Terminating when no longer desired).
func (a *Agent) replicaView(ctx context.Context) ([]api.Replica, error) {
	desired, err := a.desired()
	if err != nil {
		return nil, err
	}
	observed, err := a.rt.List(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	want := map[string]reconcile.Replica{}
	for _, d := range desired {
		want[d.ID] = d
	}
	seen := map[string]bool{}
	items := []api.Replica{}
	for _, c := range observed {
		seen[c.ID] = true
		item := api.Replica{Name: c.Name, Namespace: c.Namespace, Workload: c.Workload, Ordinal: c.Ordinal,
			Node: a.cfg.Name, PodIP: c.PodIP, SpecHash: c.SpecHash, Restarts: c.Restarts, Started: c.StartedAt}
		_, desiredHere := want[c.ID]
		busy, isBusy := a.busyAction(c.ID)
		switch {
		case !desiredHere || isBusy && busy == reconcile.Remove:
			item.Phase = "Terminating"
		case c.State == reconcile.StateRunning:
			item.Phase, item.Ready = "Running", true
		case c.State == reconcile.StateExited && now.Sub(c.ExitedAt) < reconcile.Backoff(c.BackoffStep):
			item.Phase = "CrashLoopBackOff"
		case c.State == reconcile.StateExited:
			item.Phase = "Exited"
		case c.State == reconcile.StateCreated:
			item.Phase = "ContainerCreating"
		default:
			item.Phase = "Unknown"
		}
		items = append(items, item)
	}
	for _, d := range desired {
		if seen[d.ID] {
			continue
		}
		item := api.Replica{Name: d.Name, Namespace: d.Namespace, Workload: d.Workload, Ordinal: d.Ordinal,
			Node: a.cfg.Name, SpecHash: d.SpecHash, Phase: "Pending"}
		if a.isBusy(d.ID) {
			item.Phase = "ContainerCreating"
		}
		items = append(items, item)
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].Namespace != items[j].Namespace {
			return items[i].Namespace < items[j].Namespace
		}
		if items[i].Workload != items[j].Workload {
			return items[i].Workload < items[j].Workload
		}
		if items[i].Ordinal != items[j].Ordinal {
			return items[i].Ordinal < items[j].Ordinal
		}
		return items[i].Name < items[j].Name
	})
	return items, nil
}

func (a *Agent) handleReplicas(w http.ResponseWriter, r *http.Request) {
	items, err := a.replicaView(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ReplicaList{Items: items})
}

func (a *Agent) handleNodes(w http.ResponseWriter, r *http.Request) {
	observed, err := a.rt.List(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, api.NodeList{Items: []api.Node{{
		Name: a.cfg.Name, State: "alive", Address: a.cfg.APIListen, PodSubnet: a.cfg.PodSubnet,
		Replicas: len(observed), Started: a.started,
	}}})
}

// handleLogs streams a replica's log file; with follow=true it keeps
// sending new lines until the client goes away or the replica is removed.
func (a *Agent) handleLogs(w http.ResponseWriter, r *http.Request) {
	id := reconcile.ContainerID(r.PathValue("namespace"), r.PathValue("name"))
	f, err := os.Open(a.rt.LogPath(id))
	if os.IsNotExist(err) {
		writeError(w, http.StatusNotFound, fmt.Errorf("replica %q in namespace %q has no logs on node %s (see 'starling get replicas')", r.PathValue("name"), r.PathValue("namespace"), a.cfg.Name))
		return
	} else if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	follow := r.URL.Query().Get("follow") == "true"
	flusher, _ := w.(http.Flusher)
	for {
		if _, err := io.Copy(w, f); err != nil {
			return
		}
		if !follow {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
		if _, err := os.Stat(a.rt.LogPath(id)); err != nil {
			return
		}
	}
}

func (a *Agent) handleImageImport(w http.ResponseWriter, r *http.Request) {
	names, err := a.rt.ImportImages(r.Context(), r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	a.requestReconcile()
	out := api.ImageList{Items: []api.Image{}}
	for _, n := range names {
		out.Items = append(out.Items, api.Image{Name: n})
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *Agent) handleImages(w http.ResponseWriter, r *http.Request) {
	imgs, err := a.rt.Images(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	out := api.ImageList{Items: []api.Image{}}
	for _, i := range imgs {
		out.Items = append(out.Items, api.Image{Name: i.Name, Digest: i.Target.Digest.String(), Size: i.Target.Size})
	}
	writeJSON(w, http.StatusOK, out)
}
