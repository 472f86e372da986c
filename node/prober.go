package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/runtime"
	"github.com/starling-orchestrator/starling/node/view"
)

// prober runs the startup, liveness and readiness probes of this node's
// running replicas and holds their results. It owns its lock.
type prober struct {
	rt      Runtime
	views   *view.Builder
	store   Store
	metrics *metrics
	log     *slog.Logger
	// observed is the containers the last reconcile pass saw (replicas
	// sets it: observe); wake asks for a reconcile.
	observed atomic.Pointer[[]reconcile.Container]
	wake     *wake

	// seed is the container runs this node's previous agent run
	// published ready (readySeed): a run not probed yet in this agent
	// run starts ready, as it was (seeded), not unready.
	seed map[seedKey]bool

	mu     sync.Mutex
	status map[string]probe.Status // by probeKey
}

// seedKey identifies a container run in a published status: the
// replica, its spec hash, pod address and restart count.
type seedKey struct {
	namespace, name, specHash, podIP string
	restarts                         int
}

// readySeed returns the replicas that this node's own held record (the
// last one its previous agent run published) lists ready. An agent
// restarted with its pods running must not publish them unready, nor
// program Services without them, before their next probe: it forgot
// the results, not the pods (issue 39: 5 of 115 requests to a ClusterIP
// refused across a restart under load). A record another key signed,
// or none, seeds nothing.
func readySeed(st Store, self string, key []byte) map[seedKey]bool {
	rec, ok, err := st.Get(view.StatusKey(self))
	if err != nil || !ok || rec.Deleted || !bytes.Equal(rec.Signer, key) {
		return nil
	}
	var s view.NodeStatus
	if json.Unmarshal(rec.Value, &s) != nil {
		return nil
	}
	out := map[seedKey]bool{}
	for _, r := range s.Replicas {
		if r.Ready && r.Phase == api.PhaseRunning && r.PodIP != "" {
			out[seedKey{r.Namespace, r.Name, r.SpecHash, r.PodIP, r.Restarts}] = true
		}
	}
	return out
}

// initial is the status of container run c before its first probe in
// this agent run: ps.Initial, or ready and started when the previous
// run published it ready (seed).
func (p *prober) initial(c reconcile.Container, ps probe.Probes) probe.Status {
	st := ps.Initial()
	if p.seed[seedKey{c.Namespace, c.Name, c.SpecHash, c.PodIP, c.Restarts}] {
		st.Started = true
		st.Readiness.Passing = true
	}
	return st
}

// specs maps view.ProbesKey(namespace, workload, spec hash) to the
// resolved probes of every workload's current template, and of the
// templates of older revisions that observed containers still run (a
// rollout in progress): probes belong to the spec a container was made
// from, so a new template's probes never judge (or restart) old copies.
// An old copy whose revision is not stored has no probes: ready when
// running.
func (p *prober) specs(v *view.View, observed []reconcile.Container) map[string]probe.Probes {
	out := v.Probes
	looked := map[string]bool{}
	for _, c := range observed {
		key := reconcile.WorkloadKey(c.Namespace, c.Workload)
		cur, ok := v.Hashes[key]
		if !ok || cur == c.SpecHash || looked[key] {
			continue
		}
		looked[key] = true
		revs, _, err := storedRevisions(p.store, c.Namespace, c.Workload, p.log)
		if err != nil {
			continue
		}
		if len(looked) == 1 {
			out = maps.Clone(v.Probes) // the snapshot's map is shared
		}
		for _, r := range revs {
			if r.SpecHash != cur && len(r.Template.Spec.Containers) > 0 {
				view.AddProbes(out, c.Namespace, c.Workload, r.SpecHash, &r.Template)
			}
		}
	}
	return out
}

// probeKey identifies one run of a container: a restart starts afresh.
func probeKey(c reconcile.Container) string { return c.ID + "@" + c.StartedAt.String() }

// probeStatus is the prober's status of container run c (initial when
// it was never probed).
func (p *prober) probeStatus(c reconcile.Container, ps probe.Probes) probe.Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st, ok := p.status[probeKey(c)]; ok {
		return st
	}
	return p.initial(c, ps)
}

// ready reports whether a running container counts as ready, and if not
// why: without probes, yes; otherwise once its startup probe (if any)
// and its readiness probe (if any) passed, and while no probe failed it.
func (p *prober) ready(c reconcile.Container, specs map[string]probe.Probes) (bool, string) {
	ps, ok := probesOf(c, specs)
	if !ok {
		return true, ""
	}
	st := p.probeStatus(c, ps)
	return ps.Ready(st), ps.NotReadyReason(st)
}

// probesOf finds the probes of container c, a replica's own or one of
// its members.
func probesOf(c reconcile.Container, specs map[string]probe.Probes) (probe.Probes, bool) {
	key := view.ProbesKey(c.Namespace, c.Workload, c.SpecHash)
	if !c.Own() {
		key = view.ContainerProbesKey(key, c.ContainerName)
	}
	ps, ok := specs[key]
	return ps, ok
}

// unhealthy returns, by container ID, the running containers of
// observed whose liveness or startup probe failed this run, with the
// reason (reconcile.Local: Plan stops, and so restarts, them).
func (p *prober) unhealthy(observed []reconcile.Container) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]string{}
	for _, c := range reconcile.Flatten(observed) {
		if st, ok := p.status[probeKey(c)]; ok && st.Failed != "" && c.State == reconcile.StateRunning {
			out[c.ID] = st.Failed
		}
	}
	return out
}

// execIn runs exec probes in container id through the runtime; a
// container that is no longer running says nothing about its health.
func (p *prober) execIn(id string) probe.ExecFunc {
	return func(ctx context.Context, argv []string, timeout time.Duration) (int, string, error) {
		code, out, err := p.rt.Exec(ctx, id, argv, timeout)
		if errors.Is(err, runtime.ErrNotRunning) {
			err = fmt.Errorf("%w: %v", probe.ErrUnknown, err)
		}
		return code, out, err
	}
}

// probeRun is one probe of one container run.
type probeRun struct {
	key  string
	kind probe.Kind
}

// loop runs the startup, liveness and readiness probes of this
// node's running replicas: exec probes in the container through the
// runtime, httpGet and tcpSocket ones from the node's namespace to the pod
// IP. It asks for a reconcile, which republishes the node's status and
// plans restarts, whenever a replica's readiness changes or a liveness or
// startup probe failed it; Services follow on every node.
func (p *prober) loop(ctx context.Context) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	inflight := map[probeRun]bool{}
	done := make(chan probeRun, 64)
	for {
		select {
		case <-ctx.Done():
			return
		case run := <-done:
			delete(inflight, run)
			continue
		case <-tick.C:
		}
		v := p.views.View()
		var observed []reconcile.Container
		if o := p.observed.Load(); o != nil {
			observed = *o
		}
		specs := p.specs(v, observed)
		live := map[string]bool{}
		now := time.Now()
		for _, c := range reconcile.Flatten(observed) {
			ps, ok := probesOf(c, specs)
			if !ok || c.State != reconcile.StateRunning || c.PodIP == "" {
				continue
			}
			key := probeKey(c)
			live[key] = true
			for _, kind := range ps.Due(p.probeStatus(c, ps), c.StartedAt, now) {
				run := probeRun{key, kind}
				if inflight[run] {
					continue
				}
				inflight[run] = true
				go func() {
					p.run(ctx, c, ps, kind)
					select {
					case done <- run:
					case <-ctx.Done():
					}
				}()
			}
		}
		busy := map[string]bool{}
		for run := range inflight {
			busy[run.key] = true
		}
		p.mu.Lock()
		for key := range p.status {
			if !live[key] && !busy[key] {
				delete(p.status, key)
			}
		}
		p.mu.Unlock()
	}
}

// run runs probe kind of container run c once and records the result.
func (p *prober) run(ctx context.Context, c reconcile.Container, ps probe.Probes, kind probe.Kind) {
	spec := ps.Spec(kind)
	start := time.Now()
	err := probe.Check(ctx, *spec, c.PodIP, p.execIn(c.ID))
	took := time.Since(start)
	unknown := errors.Is(err, probe.ErrUnknown)
	if !unknown {
		p.metrics.probeSeconds.WithLabelValues(string(kind), spec.Handler()).Observe(took.Seconds())
		if err != nil {
			p.metrics.probeFailures.WithLabelValues(string(kind), spec.Handler()).Inc()
		}
	}
	key := probeKey(c)
	p.mu.Lock()
	before, ok := p.status[key]
	if !ok {
		before = p.initial(c, ps)
	}
	after := ps.Observe(before, kind, err, time.Now())
	p.status[key] = after
	p.mu.Unlock()
	switch {
	case after.Failed != "" && before.Failed == "":
		p.log.Warn("probe failed; restarting container", "replica", c.Name, "probe", kind, "reason", after.Failed, "failures", ps.Spec(kind).FailureThreshold)
		p.wake.kick()
	case ps.Ready(before) != ps.Ready(after):
		p.log.Info("readiness changed", "replica", c.Name, "ready", ps.Ready(after), "probe", kind, "err", err)
		p.wake.kick()
	case before.Started != after.Started:
		p.log.Info("startup probe succeeded", "replica", c.Name, "after", time.Since(c.StartedAt).Round(time.Millisecond))
		p.wake.kick()
	case err != nil && !unknown:
		p.log.Debug("probe failed", "replica", c.Name, "probe", kind, "err", err, "took", took)
	}
}
