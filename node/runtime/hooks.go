package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// Lifecycle hooks (postStart, preStop), run as the kubelet runs them
// (pkg/kubelet/lifecycle/handlers.go, kuberuntime_container.go): postStart
// right after the container's process starts, a failure stops the run
// (reason FailedPostStartHook) and the container restarts under the usual
// backoff; preStop before the stop signal, within the grace period.

// LabelLifecycle holds the container's hooks (lifecycle as JSON), so a
// stop runs the preStop hook of the spec the container was created with,
// also after the workload is deleted or changed.
const LabelLifecycle = "starling.io/lifecycle"

// PostStartTimeout bounds a postStart hook; one that has not returned by
// then has failed. The kubelet sets no bound; a hook that never returns
// would hold the container's start for good.
const PostStartTimeout = 2 * time.Minute

// minStopGrace is the kubelet's minimumGracePeriodInSeconds: what the stop
// signal gets after a preStop hook used the rest of the grace period.
const minStopGrace = 2 * time.Second

type lifecycle struct {
	PostStart *reconcile.Hook `json:"postStart,omitempty"`
	PreStop   *reconcile.Hook `json:"preStop,omitempty"`
}

// lifecycleLabel is the LabelLifecycle value for spec ("" without hooks).
func lifecycleLabel(spec reconcile.Spec) string {
	if spec.PostStart == nil && spec.PreStop == nil {
		return ""
	}
	b, err := json.Marshal(lifecycle{PostStart: spec.PostStart, PreStop: spec.PreStop})
	if err != nil {
		return ""
	}
	return string(b)
}

// hooksOf reads the hooks a container was created with (none when the
// label is missing or unreadable).
func hooksOf(labels map[string]string) lifecycle {
	var l lifecycle
	if v := labels[LabelLifecycle]; v != "" {
		_ = json.Unmarshal([]byte(v), &l)
	}
	return l
}

// runHook runs h in container id, whose pod address is podIP, and
// returns nil when it succeeds within d: a command that exits 0, an
// HTTP GET answered 2xx or 3xx, or a sleep of its length (a sleep cut
// short by d or ctx is no failure).
func (r *Runtime) runHook(ctx context.Context, id, podIP string, h *reconcile.Hook, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	switch {
	case len(h.Exec) > 0:
		code, out, err := r.Exec(ctx, id, h.Exec, d)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("command %q did not exit within %v", strings.Join(h.Exec, " "), d)
			}
			return fmt.Errorf("command %q: %w", strings.Join(h.Exec, " "), errors.Unwrap(err))
		}
		if code != 0 {
			if out = strings.Join(strings.Fields(out), " "); out != "" {
				return fmt.Errorf("command %q exited with code %d: %s", strings.Join(h.Exec, " "), code, out)
			}
			return fmt.Errorf("command %q exited with code %d", strings.Join(h.Exec, " "), code)
		}
		return nil
	case h.HTTPGet != nil:
		g := h.HTTPGet
		host := g.Host
		if host == "" {
			host = podIP
		}
		p := probe.Spec{HTTP: true, HTTPS: g.HTTPS, HTTPPath: g.Path, Port: g.Port, Timeout: d}
		for _, hdr := range g.Headers {
			p.HTTPHeaders = append(p.HTTPHeaders, probe.Header{Name: hdr.Name, Value: hdr.Value})
		}
		if err := probe.Check(ctx, p, host, nil); err != nil {
			return fmt.Errorf("GET %s port %d: %w", g.Path, g.Port, err)
		}
		return nil
	default:
		select {
		case <-time.After(h.Sleep):
		case <-ctx.Done():
		}
		return nil
	}
}

// preStop runs container c's preStop hook, if it has one and its task
// runs, within grace less the stop signal's minimum, and returns the
// grace left for the stop signal (at least minStopGrace when grace was).
// A failed hook is logged and the stop goes on, as with the kubelet.
func (r *Runtime) preStop(ctx context.Context, c containerd.Container, task containerd.Task, grace time.Duration) time.Duration {
	if grace <= minStopGrace {
		return grace
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		return grace
	}
	h := hooksOf(labels).PreStop
	if h == nil {
		return grace
	}
	if st, err := task.Status(ctx); err != nil || st.Status != containerd.Running {
		return grace
	}
	start := time.Now()
	if err := r.runHook(ctx, c.ID(), labels[LabelPodIP], h, grace-minStopGrace); err != nil {
		r.log.Warn("preStop hook failed; stopping the container anyway", "container", c.ID(), "replica", labels[LabelName], "err", err)
	} else {
		r.log.Info("preStop hook done", "container", c.ID(), "replica", labels[LabelName], "took", time.Since(start).Round(time.Millisecond))
	}
	return max(grace-time.Since(start), minStopGrace)
}
