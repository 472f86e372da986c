package node

import (
	"context"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

// Stopping every replica of a kind at once, outside the reconcile pass:
// on a clean stop of the agent (its StatefulSet replicas) and when this
// node was forgotten (all of them).

// stopStateful stops this node's StatefulSet replicas on a clean
// shutdown, all at once, and publishes the node's status without them.
// Other containers keep running for the restarted agent to adopt, but a
// StatefulSet replica of a node that left starts elsewhere after
// --failover-timeout, and a stopped agent cannot fence: stopping it now
// keeps "at most one" through upgrades and restarts that take longer.
// The other replicas stay in the status as they are (running, ready):
// they serve on while the agent restarts, as pods do while a kubelet
// restarts, and the restarted agent takes their readiness from this
// record (readySeed) instead of publishing them unready (issue 39: a
// restarted agent programmed a Service as empty and refused requests).
func (r *replicas) stopStateful() {
	v := r.views.View()
	stateful := v.StatefulWorkloads()
	isStateful := func(namespace, workload string) bool { return stateful[reconcile.WorkloadKey(namespace, workload)] }
	r.stopWhere(func(c reconcile.Container) bool { return isStateful(c.Namespace, c.Workload) },
		"agent stopping: a StatefulSet replica must not outlive its fencing", "stopped StatefulSet replica before leaving")
	r.mu.Lock()
	var keep []reconcile.Replica
	for _, d := range r.mine {
		if !isStateful(d.Namespace, d.Workload) {
			keep = append(keep, d)
		}
	}
	r.mu.Unlock()
	listCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if left, err := r.rt.List(listCtx); err == nil {
		r.status.publishStatus(r.localReplicas(left, keep, r.probes.specs(v, left)))
	}
}

// stopAllOn stops every replica this node runs (stopAll) once forgotten
// is closed (members.forgotten), unless ctx ends first.
func (r *replicas) stopAllOn(ctx context.Context, forgotten <-chan struct{}) {
	select {
	case <-ctx.Done():
	case <-forgotten:
		r.stopAll()
	}
}

// stopAll stops every replica this node runs: it was forgotten
// (members.forgotten), so they are its peers' to run.
func (r *replicas) stopAll() {
	r.stopWhere(func(reconcile.Container) bool { return true },
		"this node was forgotten ('starling node forget'): its replicas run elsewhere", "stopped a replica of a forgotten node")
}

// stopWhere stops the containers of this node that match, all at once
// (a StatefulSet replica within its fencing grace), once the actions in
// flight have ended; reason goes to the runtime, done to the log.
func (r *replicas) stopWhere(match func(reconcile.Container) bool, reason, done string) {
	r.wg.Wait() // actions in flight end first
	listCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	observed, err := r.rt.List(listCtx)
	cancel()
	if err != nil {
		r.log.Warn("stop replicas: list containers", "err", err, "why", reason)
		return
	}
	var wg sync.WaitGroup
	for _, c := range observed {
		if !match(c) {
			continue
		}
		c.GracePeriod = min(c.GracePeriod, r.fence.statefulGrace())
		wg.Add(1)
		go func(c reconcile.Container) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), c.GracePeriod+10*time.Second)
			defer cancel()
			if err := r.rt.Execute(ctx, reconcile.Action{Type: reconcile.Remove, Old: c, Reason: reason}); err != nil {
				r.log.Warn("stop replica", "replica", c.Name, "err", err, "why", reason)
				return
			}
			r.log.Info(done, "replica", c.Name)
		}(c)
	}
	wg.Wait()
}
