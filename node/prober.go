package node

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// readinessSpecs maps "namespace/workload" to the resolved readiness probe
// of Deployments that have an httpGet or tcpSocket one. (exec probes are
// not run yet: such replicas are ready when running.)
func readinessSpecs(workloads []manifest.Object) map[string]probe.Spec {
	out := map[string]probe.Spec{}
	for _, o := range workloads {
		c := o.PodTemplate().Spec.Containers[0]
		rp := c.ReadinessProbe
		if rp == nil {
			continue
		}
		port := func(p corev1.Container, v int32, name string) int32 {
			if name == "" {
				return v
			}
			for _, cp := range p.Ports {
				if cp.Name == name {
					return cp.ContainerPort
				}
			}
			return 0
		}
		s := probe.Spec{
			InitialDelay:     time.Duration(rp.InitialDelaySeconds) * time.Second,
			Period:           time.Duration(max(rp.PeriodSeconds, 1)) * time.Second,
			Timeout:          time.Duration(max(rp.TimeoutSeconds, 1)) * time.Second,
			SuccessThreshold: int(rp.SuccessThreshold),
			FailureThreshold: int(rp.FailureThreshold),
		}
		switch {
		case rp.HTTPGet != nil:
			s.HTTP, s.HTTPPath = true, rp.HTTPGet.Path
			s.Port = port(c, rp.HTTPGet.Port.IntVal, rp.HTTPGet.Port.StrVal)
		case rp.TCPSocket != nil:
			s.Port = port(c, rp.TCPSocket.Port.IntVal, rp.TCPSocket.Port.StrVal)
		default:
			continue
		}
		if s.Port > 0 {
			out[o.Namespace+"/"+o.Name] = s
		}
	}
	return out
}

// probeKey identifies one run of a container: a restart starts afresh.
func probeKey(c reconcile.Container) string { return c.ID + "@" + c.StartedAt.String() }

// ready reports whether a running container counts as ready: without a
// readiness probe, yes; with one, once the probe passed.
func (a *Agent) ready(c reconcile.Container, specs map[string]probe.Spec) bool {
	if _, ok := specs[c.Namespace+"/"+c.Workload]; !ok {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.probes[probeKey(c)].Ready
}

// proberLoop runs the readiness probes of this node's running replicas
// (from the node's namespace, to the pod IP) and asks for a reconcile,
// which republishes the node's status, whenever a replica's readiness
// changes; Services follow on every node.
func (a *Agent) proberLoop(ctx context.Context) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	inflight := map[string]bool{}
	done := make(chan string, 64)
	for {
		select {
		case <-ctx.Done():
			return
		case key := <-done:
			delete(inflight, key)
			continue
		case <-tick.C:
		}
		v, err := a.readView()
		if err != nil {
			continue
		}
		specs := readinessSpecs(v.workloads)
		a.mu.Lock()
		observed := a.lastObserved
		a.mu.Unlock()
		live := map[string]bool{}
		now := time.Now()
		for _, c := range observed {
			spec, ok := specs[c.Namespace+"/"+c.Workload]
			if !ok || c.State != reconcile.StateRunning || c.PodIP == "" {
				continue
			}
			key := probeKey(c)
			live[key] = true
			a.mu.Lock()
			st := a.probes[key]
			a.mu.Unlock()
			if inflight[key] || !probe.Due(st, spec, c.StartedAt, now) {
				continue
			}
			inflight[key] = true
			go func(key, ip string, spec probe.Spec) {
				err := probe.Check(ctx, spec, ip)
				a.mu.Lock()
				before := a.probes[key]
				after := before.Observe(err == nil, spec, time.Now())
				a.probes[key] = after
				a.mu.Unlock()
				if before.Ready != after.Ready {
					a.log.Info("readiness changed", "container", key, "ready", after.Ready, "err", err)
					a.requestReconcile()
				}
				select {
				case done <- key:
				case <-ctx.Done():
				}
			}(key, c.PodIP, spec)
		}
		a.mu.Lock()
		for key := range a.probes {
			if !live[key] && !inflight[key] {
				delete(a.probes, key)
			}
		}
		a.mu.Unlock()
	}
}
