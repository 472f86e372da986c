package node

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"slices"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
	"github.com/starling-orchestrator/starling/node/logfile"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

// logs serves replicas' logs, as the kubelet serves a container's:
// plain lines, stdout and stderr interleaved. A replica of another live
// node is proxied there. It implements apiserver.Logs.
type logs struct {
	self     string
	rt       Runtime
	views    *view.Builder
	replicas *replicas
	peers    *peers
	log      *slog.Logger
}

var _ apiserver.Logs = (*logs)(nil)

// ServeLogs streams the log of replica namespace/name: follow keeps
// sending until the run ends; previous sends the run before; tail,
// since and timestamps as kubectl logs.
func (l *logs) ServeLogs(w http.ResponseWriter, r *http.Request, namespace, name string, lo api.LogOptions) {
	o := readOptions(lo, time.Now())
	previous := lo.Previous
	id := reconcile.ContainerID(namespace, name)
	if lo.Container != "" {
		c, _ := reconcile.Find(l.replicas.lastObserved(), id, lo.Container)
		id = c.ID // "" (no such container here): no log, the replica's node is asked
	}
	path := l.rt.LogPath(id)
	if previous {
		path = l.rt.PreviousLogPath(id)
	} else if lo.Follow {
		// Following ends, as kubectl's, when the run ends; what it wrote
		// last is still sent.
		o.Follow = func() bool { return l.replicas.runningNow(id) }
	}
	if len(logfile.Files(path)) == 0 {
		if r.Header.Get(trust.ProxiedHeader) == "" && l.proxy(w, r) {
			return
		}
		what := "no logs"
		if previous {
			what = "no previous run"
		}
		if lo.Container != "" {
			what += " of a container " + lo.Container
		}
		apiserver.WriteError(w, api.Errorf(http.StatusNotFound, "replica %q in namespace %q has %s on node %s (see 'starling get replicas')", name, namespace, what, l.self))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := logfile.Read(r.Context(), path, o, flushWriter{w}); err != nil && !errors.Is(err, logfile.ErrNoLog) {
		l.log.Warn("serve logs", "replica", name, "err", err)
	}
}

// readOptions is what logfile.Read needs for o at now.
func readOptions(o api.LogOptions, now time.Time) logfile.ReadOptions {
	ro := logfile.ReadOptions{Tail: o.Tail, Timestamps: o.Timestamps, Since: o.SinceTime}
	if o.SinceSeconds > 0 {
		ro.Since = now.Add(-time.Duration(o.SinceSeconds) * time.Second)
	}
	return ro
}

// flushWriter flushes every write, so a followed log reaches the client
// as it is written.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(b []byte) (int, error) { return f.w.Write(b) }

func (f flushWriter) Flush() {
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
}

// proxy forwards a logs request to the live node whose status lists
// the replica (httputil.ReverseProxy: streamed, flushed as it comes,
// hop-by-hop headers handled), authenticated as this node (peers.endpoint),
// never with the operator's token. It reports whether it answered the
// client.
func (l *logs) proxy(w http.ResponseWriter, r *http.Request) bool {
	v := l.views.View()
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	for node, s := range v.Statuses {
		if node == l.self || !v.Alive[node] {
			continue
		}
		if !slices.ContainsFunc(s.Replicas, func(rep api.Replica) bool { return rep.Namespace == ns && rep.Name == name }) {
			continue
		}
		fail := func(w http.ResponseWriter, err error) {
			apiserver.WriteError(w, api.Errorf(http.StatusBadGateway, "logs of replica %s from node %s: %v", name, node, err))
		}
		base, rt, prepare, err := l.peers.endpoint(node, s)
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
