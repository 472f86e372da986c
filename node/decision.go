package node

import (
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

// strategyOf resolves a workload's update strategy to replica counts.
// For Deployments it is Kubernetes' deploymentutil.ResolveFenceposts:
// maxSurge rounds up, maxUnavailable rounds down, and if both come out 0
// maxUnavailable is 1 so an update can always proceed. A StatefulSet
// updates one replica at a time from the highest ordinal, never surges
// (one name, one copy), and with OrderedReady starts ordinals in order.
func strategyOf(o manifest.Object) reconcile.Strategy {
	n := o.Replicas()
	if st := o.StatefulSet; st != nil {
		return reconcile.Strategy{Replicas: n, MaxUnavailable: 1, Reverse: true,
			Ordered: st.Spec.PodManagementPolicy != appsv1.ParallelPodManagement}
	}
	d := o.Deployment
	s := reconcile.Strategy{Replicas: n, Paused: d.Spec.Paused}
	if d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		s.Recreate = true
		return s
	}
	quarter := intstr.FromString("25%")
	surge, unavailable := &quarter, &quarter
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil {
		if ru.MaxSurge != nil {
			surge = ru.MaxSurge
		}
		if ru.MaxUnavailable != nil {
			unavailable = ru.MaxUnavailable
		}
	}
	// Validation rejects malformed values; an error here leaves 0.
	s.MaxSurge, _ = intstr.GetScaledValueFromIntOrPercent(surge, n, true)
	s.MaxUnavailable, _ = intstr.GetScaledValueFromIntOrPercent(unavailable, n, false)
	if s.MaxSurge == 0 && s.MaxUnavailable == 0 {
		s.MaxUnavailable = 1
	}
	return s
}

// budgetInput builds reconcile.Gate's input but for the owned replicas
// (Decide adds them): the strategies of the Deployments Gate may be asked
// about, and every copy of them the cluster view knows (this node's from
// its own observation, live peers' from their status records). Gate asks
// only about this node's replicas, each owned by placement or kept from a
// container observed here, so only their workloads are read: a pass
// costs O(replicas of the cluster) map lookups, without building a copy
// of every workload on every node.
func (r *replicas) budgetInput(v *view.View, observed []reconcile.Container) reconcile.Budget {
	specs := r.probes.specs(v, observed)
	ready := map[string]bool{}
	for _, c := range observed {
		ready[c.ID] = r.localReady(c, specs)
	}
	in := reconcile.Budget{
		Ready:      func(id string) bool { return ready[id] },
		Strategies: map[string]reconcile.Strategy{},
		Copies:     map[string][]reconcile.Copy{},
	}
	own := v.OwnedBy(r.self).Workloads
	// Wanted workloads by namespace and name: no key is built for the
	// replicas of the others.
	type ref struct{ namespace, name string }
	wanted := map[ref]string{}
	for _, o := range v.Workloads {
		key := reconcile.WorkloadKey(o.Namespace, o.Name)
		if o.IsWorkload() && own[key] {
			wanted[ref{o.Namespace, o.Name}] = key
		}
	}
	for _, c := range observed {
		wanted[ref{c.Namespace, c.Workload}] = reconcile.WorkloadKey(c.Namespace, c.Workload)
	}
	for _, o := range v.Workloads {
		if key, ok := wanted[ref{o.Namespace, o.Name}]; ok && o.IsWorkload() {
			in.Strategies[key] = strategyOf(o)
		}
	}
	for _, c := range observed {
		key := wanted[ref{c.Namespace, c.Workload}]
		in.Copies[key] = append(in.Copies[key], reconcile.Copy{Node: r.self, Ordinal: c.Ordinal, SpecHash: c.SpecHash, Ready: ready[c.ID]})
	}
	for name, s := range v.Statuses {
		if name == r.self || !v.Alive[name] {
			continue
		}
		// A record an earlier run of the node wrote (view.StaleRecords) lists
		// copies of unknown state: they count as copies (Recreate waits
		// for an old one), never as ready ones (the budget).
		current := !v.Stale[name]
		for _, rep := range s.Replicas {
			key, ok := wanted[ref{rep.Namespace, rep.Workload}]
			if !ok || !rep.Phase.HasContainer() {
				continue // not asked about; or no container: not a copy
			}
			in.Copies[key] = append(in.Copies[key], reconcile.Copy{Node: name, Ordinal: rep.Ordinal, SpecHash: rep.SpecHash,
				Ready: current && rep.Available()})
		}
	}
	return in
}

// localReady says whether one of this node's containers is running, ready
// and not being stopped.
func (r *replicas) localReady(c reconcile.Container, specs map[string]probe.Probes) bool {
	if c.State != reconcile.StateRunning {
		return false
	}
	if t, busy := r.acts.busyAction(c.ID); busy && (t == reconcile.Remove || t == reconcile.Replace || t == reconcile.Stop) {
		return false
	}
	ready, _ := r.probes.ready(c, specs)
	return ready
}

// decision is reconcile.Decide's input for this node at now, from the
// snapshot v, its containers, the fencing input f (fence.fencing) and the
// handoffs of the last pass; it changes nothing.
func (r *replicas) decision(v *view.View, observed []reconcile.Container, f reconcile.Fencing, now time.Time) reconcile.Decision {
	return reconcile.Decision{
		Ownership: reconcile.Ownership{
			Self: r.self, All: v.Candidates(r.self, observed), Owner: v.Owner.Of, Observed: observed,
			ReadyElsewhere: view.ReadyAtOwner(r.self, v.Current, v.Statuses, v.Owner.Of, observed),
			HandoffSince:   r.handoffs, Now: now, Timeout: r.handoffTimeout,
		},
		Budget:        r.budgetInput(v, observed),
		Fencing:       f,
		Stateful:      v.StatefulWorkloads(),
		StatefulGrace: r.fence.statefulGrace(),
	}
}
