package node

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// localReplicas is the status of the replicas on this node: every
// container (Terminating when this node no longer runs it) and every
// replica it owns that has no container yet (Pending or ContainerCreating).
func (r *replicas) localReplicas(observed []reconcile.Container, mine []reconcile.Replica, probes map[string]probe.Probes) []api.Replica {
	now := time.Now()
	want := map[string]*reconcile.Replica{}
	for i := range mine {
		want[mine[i].ID] = &mine[i]
	}
	ready := func(c reconcile.Container) (bool, string) { return r.probes.ready(c, probes) }
	seen := map[string]bool{}
	slots := map[string]bool{}
	items := []api.Replica{}
	for _, c := range observed {
		seen[c.ID] = true
		slots[slotOf(c.Namespace, c.Workload, c.Ordinal)] = true
		item := api.Replica{Name: c.Name, Namespace: c.Namespace, Workload: c.Workload, Ordinal: c.Ordinal,
			Node: r.self, PodIP: c.PodIP, SpecHash: c.SpecHash, Restarts: c.Restarts, Started: c.StartedAt.UTC(), Created: c.CreatedAt.UTC(),
			LastState: c.Last.UTC()}
		if c.State == reconcile.StateExited {
			t := reconcile.Terminated(c.ExitCode, c.OOMKilled, c.StartedAt, c.ExitedAt)
			item.Exit = t.UTC()
		}
		var spec *reconcile.Spec
		if d := want[c.ID]; d != nil {
			spec = &d.Spec
		}
		pod := reconcile.StatusOf(c, spec, ready, now)
		item.Containers, item.Restarts = pod.Containers, pod.Restarts
		if msg, failed := r.acts.podFailure(want[c.ID], c); failed {
			item.Reason = msg
		} else if phase, msg := r.configError(c.ID); phase == api.PhaseConfigError {
			item.Reason = reconcile.ConfigErrorReason + ": " + msg // a replace held back
		} else if msg != "" {
			item.Reason = msg
		}
		busy, isBusy := r.acts.busyAction(c.ID)
		switch {
		case want[c.ID] == nil || isBusy && (busy == reconcile.Remove || busy == reconcile.Replace):
			item.Phase = api.PhaseTerminating
		case c.State == reconcile.StateRunning:
			var why string
			item.Phase = api.PhaseRunning
			item.Ready, why = ready(c)
			item.Ready = item.Ready && pod.Ready == pod.Total
			if item.Reason == "" {
				item.Reason = why
			}
		case pod.Init:
			item.Phase = api.PhaseInit
			if pod.Failed != "" {
				item.Phase, item.Reason = api.PhaseCrashLoopBackOff, pod.Failed
			}
		case c.State == reconcile.StateCreated && pod.InitTotal > 0:
			item.Phase = api.PhasePodInitializing
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
	waiting := r.waitingSince(mine, seen, now)
	for _, d := range mine {
		if seen[d.ID] {
			continue
		}
		item := api.Replica{Name: d.Name, Namespace: d.Namespace, Workload: d.Workload, Ordinal: d.Ordinal,
			Node: r.self, SpecHash: d.SpecHash, Phase: api.PhasePending, Created: waiting[d.ID]}
		if msg, failed := r.acts.lastFailure(d.ID); failed {
			item.Phase, item.Reason = api.PhaseCreateBackOff, msg
		}
		if phase, msg := r.configError(d.ID); msg != "" {
			item.Phase, item.Reason = phase, msg
		}
		if t, busy := r.acts.busyAction(d.ID); busy {
			// A retry shows the image transfer's progress, or else the
			// last failure until it clears: the reason of a replica
			// whose image cannot be found showed only between retries.
			reason := r.rt.ImageProgress(d.Spec.Image)
			if msg, failed := r.acts.lastFailure(d.ID); failed && reason == "" {
				reason = msg
			}
			item.Phase, item.Reason = api.PhaseContainerCreating, reason
			if t == reconcile.Replace && slots[slotOf(d.Namespace, d.Workload, d.Ordinal)] {
				// A Replace stops the old copy first.
				item.Phase, item.Reason = api.PhasePending, "waiting for the old copy to stop"
			}
		}
		items = append(items, item)
	}
	api.SortReplicas(items)
	return items
}

// waitingSince records when this node first owned each replica of mine
// that has no container (not in seen), forgets the others, and returns
// the record. A status written with mine nil (a stopping agent) keeps it.
func (r *replicas) waitingSince(mine []reconcile.Replica, seen map[string]bool, now time.Time) map[string]time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if mine == nil {
		return r.waiting
	}
	next := make(map[string]time.Time, len(r.waiting))
	for _, d := range mine {
		if seen[d.ID] {
			continue
		}
		t, ok := r.waiting[d.ID]
		if !ok {
			t = now.UTC().Truncate(time.Second)
		}
		next[d.ID] = t
	}
	r.waiting = next
	return next
}

// slotOf names a workload's ordinal: "namespace/workload/ordinal".
func slotOf(namespace, workload string, ordinal int) string {
	return namespace + "/" + workload + "/" + strconv.Itoa(ordinal)
}

// publishRunning publishes, before a run's first pass, this node's record
// with the replicas whose containers are here now, in their phases. The
// stored record is the previous run's: after a crash it lists replicas
// that no longer run, Running since before the peers that took them over
// started theirs, so the first pass kept them here (placement.Keep: the
// oldest running copy stays) and started them all again, to stop them
// again once its own record said they were Pending. An agent restarted
// with its containers running lists them as before. It reports whether
// any container is here; a runtime that does not answer leaves the
// record to the first pass (and reports true: nothing is known).
func (r *replicas) publishRunning(ctx context.Context) bool {
	observed, err := r.rt.List(ctx)
	if err != nil {
		return true
	}
	observed = reconcile.Local{Subnet: localSubnet(r.subnets.current(), r.subnets.settled.Load())}.Mark(observed)
	here := make([]reconcile.Replica, len(observed))
	for i, c := range observed {
		here[i] = reconcile.Replica{ID: c.ID}
	}
	r.views.Rebuild(time.Now()) // the probes of the synced objects
	r.status.publishStatus(r.localReplicas(observed, here, r.probes.specs(r.views.View(), observed)))
	return len(observed) > 0
}

// configError is the phase and why the last pass held replica id back:
// its ConfigMaps or Secrets, or its claims' volumes (Pending) ("": not).
func (r *replicas) configError(id string) (api.Phase, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.configErrors[id]
	var wait *reconcile.ClaimWait
	switch {
	case err == nil:
		return "", ""
	case errors.As(err, &wait):
		return api.PhasePending, err.Error()
	}
	return api.PhaseConfigError, err.Error()
}
