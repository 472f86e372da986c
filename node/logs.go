package node

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/logfile"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// handleLogs streams a replica's log (GET /v1/logs/{namespace}/{name}),
// as the kubelet serves a container's: plain lines, stdout and stderr
// interleaved. Query: follow=true keeps sending until the run ends;
// previous=true the run before; tail=N the last N lines; sinceSeconds=S
// or sinceTime=RFC3339 only what was written since; timestamps=true each
// line with its time. A replica of another live node is proxied there.
func (a *Agent) handleLogs(w http.ResponseWriter, r *http.Request) {
	if err := checkRef(r.PathValue("namespace"), r.PathValue("name")); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	lo, err := api.ParseLogOptions(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	o := readOptions(lo, time.Now())
	previous := lo.Previous
	id := reconcile.ContainerID(r.PathValue("namespace"), r.PathValue("name"))
	path := a.rt.LogPath(id)
	if previous {
		path = a.rt.PreviousLogPath(id)
	} else if lo.Follow {
		// Following ends, as kubectl's, when the run ends; what it wrote
		// last is still sent.
		o.Follow = func() bool { return a.runningNow(id) }
	}
	if len(logfile.Files(path)) == 0 {
		if r.Header.Get(proxiedHeader) == "" && a.proxyLogs(w, r) {
			return
		}
		what := "no logs"
		if previous {
			what = "no previous run"
		}
		writeError(w, http.StatusNotFound, fmt.Errorf("replica %q in namespace %q has %s on node %s (see 'starling get replicas')", r.PathValue("name"), r.PathValue("namespace"), what, a.cfg.Name))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := logfile.Read(r.Context(), path, o, flushWriter{w}); err != nil && !errors.Is(err, logfile.ErrNoLog) {
		a.log.Warn("serve logs", "replica", r.PathValue("name"), "err", err)
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

// runningNow reports whether container id's task ran at the last
// observation (reconcile runs on every task exit).
func (a *Agent) runningNow(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.lastObserved {
		if c.ID == id {
			return c.State == reconcile.StateRunning
		}
	}
	return false
}
