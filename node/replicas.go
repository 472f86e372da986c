package node

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/runtime"
	"github.com/starling-orchestrator/starling/node/view"
)

// replicas is the reconcile controller: one pass reads the view and the
// containers, asks the pure reconcile.Decide what to do, runs the
// actions, and publishes this node's record. It owns its state: the
// handoffs of the last pass (loop goroutine only) and the containers it
// last observed (its lock).
type replicas struct {
	self           string
	resync         time.Duration // --resync-interval
	handoffTimeout time.Duration
	drainDelay     time.Duration

	rt      Runtime
	views   *view.Builder
	acts    *actions
	probes  *prober
	fence   *fence
	lease   *lease
	status  *self
	subnets *subnets
	members *members
	metrics *metrics
	log     *slog.Logger

	wake *wake          // requests to reconcile now, from any part
	wg   sync.WaitGroup // running actions

	handoffs map[string]time.Time // owned by the loop goroutine

	mu       sync.Mutex
	observed []reconcile.Container // what the last pass saw
	mine     []reconcile.Replica   // what it owned
	// evictions are the replicas over an emptyDir's sizeLimit
	// (volumes.Updater).
	evictions interface{ Evicted() map[string]string }
	// configErrors are its replicas held back by a missing ConfigMap,
	// Secret, key or claim's volume (reconcile.Output.ConfigErrors).
	configErrors map[string]error
	down         bool // the runtime did not answer the last pass
	// waiting is when this node first owned each replica it owns that
	// has no container yet (by replica ID): the replica's creation time
	// until a container has one (kubectl's AGE of a pod that never
	// started).
	waiting map[string]time.Time
}

// runtimeDown is a pass that could not list containers (containerd
// unreachable). The containers keep running under their shims, and the
// prober keeps probing them (HTTP, TCP and gRPC probes need no runtime),
// so the status still follows the probes: it is published from the last
// observation with today's readiness, so an endpoint that fails its probe
// leaves every node's Service rules. It logs one warning per outage, and
// retries every second.
func (r *replicas) runtimeDown(v *view.View, err error) time.Duration {
	r.mu.Lock()
	first := !r.down
	r.down = true
	observed, mine := r.observed, r.mine
	r.mu.Unlock()
	if first {
		r.log.Warn("container runtime unreachable: replicas keep running, their readiness follows the probes; nothing is started or stopped until it answers (retrying every second)", "err", err)
	}
	if observed != nil {
		r.status.publishSoon(r.localReplicas(observed, mine, r.probes.specs(v, observed)), time.Now())
	}
	return time.Second
}

// runtimeUp notes that the runtime answered, logging the end of an outage.
func (r *replicas) runtimeUp() {
	r.mu.Lock()
	was := r.down
	r.down = false
	r.mu.Unlock()
	if was {
		r.log.Info("container runtime reachable again")
	}
}

// wake is a request to the replicas' loop for a pass now, which any
// part may make without waiting (coalesced: a channel of one); the loop
// is its only reader. Made before the parts, so that each is given it
// whole instead of a function of the replicas.
type wake struct {
	ch chan struct{}
	// imported: an image was imported since the last pass, which then
	// retries the actions that failed for want of one (resetFailures).
	imported atomic.Bool
}

func newWake() *wake { return &wake{ch: make(chan struct{}, 1)} }

// kick asks for a pass now.
func (w *wake) kick() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// imageImported asks for a pass that retries the failed actions at once.
func (w *wake) imageImported() {
	w.imported.Store(true)
	w.kick()
}

// lastObserved is the containers the last pass saw (the prober's input).
func (r *replicas) lastObserved() []reconcile.Container {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.observed
}

// runningNow reports whether container id's task ran at the last
// observation (reconcile runs on every task exit).
func (r *replicas) runningNow(id string) bool {
	for _, c := range reconcile.Flatten(r.lastObserved()) {
		if c.ID == id {
			return c.State == reconcile.StateRunning
		}
	}
	return false
}

// loop runs reconcile on every view change, every kick, when a restart
// backoff expires, and every --resync-interval. It first waits for the
// node to hold the cluster's state (acting on stale state would
// resurrect deleted objects) and for its pod subnet.
func (r *replicas) loop(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-r.members.synced:
	}
	if !r.subnets.claimSubnet(ctx) {
		return
	}
	r.status.forget() // republish with SubnetReady
	if !r.publishRunning(ctx) && r.members.cluster.NumMembers() > 1 {
		// Nothing runs here, and peers do: back from a crash or a
		// reboot (or new). A node alone has nothing to wait for.
		// This node's view of its peers is from before it went away
		// and lists none of the replicas they took over; acting on it
		// started them all again, to stop them once the join's sync
		// brought the records (three records of this node and two of
		// the holder for each). It waits for the records to stop
		// arriving, at most half of --rejoin-settle (its peers count
		// it again after --rejoin-settle). An agent restarted with its
		// containers running does not wait: its peers took nothing
		// over, and its StatefulSet fence lease runs.
		waitForState(ctx, r.views.Changed, r.members.settle/2)
	}
	// The first pass acts on a view built after the sync: one built
	// before it (at start, before the join's push/pull) holds this node
	// alone as live, and from it a node returning to a cluster of 20
	// started every replica of the cluster (200). It also holds the
	// record publishRunning just wrote, not the previous run's (which
	// lists replicas that died with it: placement.Keep would keep them
	// here). A rebuild reads only the records that changed.
	r.views.Rebuild(time.Now())
	timer := time.NewTimer(0)
	defer timer.Stop()
	changed := r.views.Changed()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-r.wake.ch:
		case <-timer.C:
		}
		if r.wake.imported.Swap(false) {
			r.acts.resetFailures()
		}
		// Taken before the pass reads the view: a snapshot stored while
		// the pass runs wakes the next one.
		changed = r.views.Changed()
		requeue := r.reconcile(ctx)
		wait := r.resync
		if requeue > 0 && requeue < wait {
			wait = requeue
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// reconcile runs one pass: read the cluster view, decide what this node
// owns (placement plus make-before-break handoffs), observe, Plan, and
// start the actions whose containers are not already being worked on. It
// publishes this node's status and returns the requeue.
func (r *replicas) reconcile(ctx context.Context) time.Duration {
	start := time.Now()
	defer func() { r.metrics.reconcileSeconds.Observe(time.Since(start).Seconds()) }()
	v := r.views.View()
	if !v.Synced {
		// Built before the sync (the loop's rebuild after it failed on a
		// store error): build again, and come back soon.
		r.views.Rebuild(time.Now())
		return time.Second
	}
	listed := r.acts.listEpoch()
	observed, err := r.rt.List(ctx)
	if err != nil {
		return r.runtimeDown(v, err)
	}
	r.runtimeUp()
	r.metrics.observe(observed)
	// What the node knows beyond containerd's word, on a copy: every
	// step below sees the same containers (Decide marks them again).
	local := reconcile.Local{Subnet: localSubnet(r.subnets.current(), r.subnets.settled.Load()), Unhealthy: r.probes.unhealthy(observed),
		Evicted: r.evictions.Evicted()}
	observed = local.Mark(observed)
	f, seen, known := r.fence.fencing(v, observed, start)
	r.fence.note(f, seen, known)
	d := r.decision(v, observed, f, start)
	d.Local, d.Backoff, d.ServiceEnv, d.Config, d.HostIP, d.Claims = local, r.acts.backoffs(), serviceEnv(v), v.Config, v.Statuses[r.self].HostIP(), v.ClaimsOn(r.self)
	d.OncePod = v.OncePodClaims()
	d.Allocatable = reconcile.Allocatable(v.Statuses[r.self].Capacity)
	out := reconcile.Decide(d, time.Now())
	observed = out.Observed
	r.mu.Lock()
	r.observed, r.mine, r.configErrors = observed, out.Mine, out.ConfigErrors
	r.probes.observed.Store(&observed)
	r.mu.Unlock()
	r.lease.set(atMostOneIDs(v, observed, out.Mine))
	r.handoffs = out.Handoffs
	r.acts.pruneFailures(out.Mine, observed)
	requeue := out.Requeue
	for _, act := range out.Actions {
		// Decide left out the actions under backoff; claim guards
		// against an action that began or ended since the list.
		if !r.acts.claim(act, listed) {
			continue
		}
		r.wg.Add(1)
		go r.execute(ctx, act)
	}
	claimID := func(id string) (func(), bool) { return r.acts.claimID(id, listed) }
	if err := r.rt.CleanupSandboxes(ctx, observed, claimID); err != nil {
		r.log.Warn("reconcile: sandbox cleanup", "err", err)
	}
	if wait := r.status.publishSoon(r.localReplicas(observed, out.Mine, r.probes.specs(v, observed)), time.Now()); wait > 0 && (requeue == 0 || wait < requeue) {
		requeue = wait
	}
	if r.acts.creating() && (requeue == 0 || requeue > time.Second) {
		requeue = time.Second // the progress of image transfers goes into the status every second
	}
	return requeue
}

// actionTimeout bounds one action: image pulls make creates slow; a stop
// waits the grace period first.
func actionTimeout(act reconcile.Action) time.Duration {
	switch act.Type {
	case reconcile.Remove, reconcile.Stop:
		return act.Old.GracePeriod + time.Minute
	case reconcile.Start:
		return 2 * time.Minute
	default:
		return act.Old.GracePeriod + 10*time.Minute
	}
}

func (r *replicas) execute(ctx context.Context, act reconcile.Action) {
	defer r.wg.Done()
	defer func() {
		r.acts.finish(act)
		r.wake.kick()
	}()
	start := time.Now()
	name := act.Replica.Name
	if name == "" {
		name = act.Old.Name
	}
	// A stuck registry, peer or containerd call must not hold the replica
	// busy forever: every action has a deadline.
	ctx, cancel := context.WithTimeout(ctx, actionTimeout(act))
	defer cancel()
	if d := act.DrainDelay(r.drainDelay); d > 0 {
		// The replica is already published as Terminating (not ready):
		// give every node time to take it out of its Service rules
		// before SIGTERM, so no new connection meets a closed port.
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	if err := r.rt.Execute(ctx, act); err != nil {
		if errors.Is(err, runtime.ErrTaskRunning) {
			// Planned on a list that missed a start (claim guards the
			// agent's own actions; this guards the rest): nothing done.
			r.log.Warn("start skipped: the task already runs", "replica", name, "reason", act.Reason)
			return
		}
		f := r.acts.recordFailure(act, err, time.Now())
		r.log.Error("action failed", "action", act.Type, "replica", name, "reason", act.Reason, "err", err,
			"failures", f.count, "retryIn", time.Until(f.until).Round(time.Millisecond))
		r.metrics.actionErrors.WithLabelValues(string(act.Type)).Inc()
		return
	}
	r.acts.clearFailure(act)
	if act.Type == reconcile.Start && act.Old.State == reconcile.StateExited {
		r.metrics.restarts.Inc()
	}
	r.log.Info("action done", "action", act.Type, "replica", name, "reason", act.Reason, "took", time.Since(start).Round(time.Millisecond))
}
