package node

import (
	"context"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// fencing builds reconcile.Fence's input from this node's view.
//
// Quorum: the known nodes are every node with a status record (a node is
// known until `starling node forget`; one that left cleanly still counts,
// because its containers keep running) and every live member (a node
// still joining; a --dry-run agent, which publishes no record, counts only
// while it is up). Seen are this node and the members memberlist reports
// alive (a member back from dead only after --rejoin-settle); a member this node suspects (its own probe failed) is not seen,
// so the minority side of a partition loses its majority on the first
// failed probes, seconds before the majority declares it dead.
//
// Held ordinals: copies reported by a node memberlist calls alive or
// suspect, and those of a node down (dead or left) for less than
// --failover-timeout, counted from when this agent saw it go down (from
// this agent's start when it never saw it up).
func (a *Agent) fencing(v view, observed []reconcile.Container, now time.Time) (reconcile.Fencing, int, int) {
	known := map[string]bool{a.cfg.Name: true}
	for name := range v.statuses {
		known[name] = true
	}
	up := map[string]bool{}
	seen := 1
	members := a.cluster.Members()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range members {
		if m.Name == a.cfg.Name {
			continue
		}
		if m.State == gossip.StateAlive || m.State == gossip.StateSuspect {
			up[m.Name] = true
			known[m.Name] = true
		}
		// A member back from dead counts only after --rejoin-settle: a
		// healed minority must not regain its majority before it has
		// the majority's state (which replicas now run where).
		_, settling := a.memberBack[m.Name]
		if m.State == gossip.StateAlive && !settling && now.Sub(a.lastAck[m.Name]) < a.cfg.FenceTimeout {
			seen++
		}
	}
	f := reconcile.Fencing{Quorum: reconcile.Majority(seen, len(known)), Held: map[string]map[int]bool{}, Observed: observed}
	select {
	case <-a.pinged:
	default:
		f.Unknown = true // first pings not answered yet (agent just started)
	}
	for name, s := range v.statuses {
		if name == a.cfg.Name {
			continue
		}
		if !up[name] {
			since, ok := a.memberDown[name]
			if !ok {
				since = a.started
			}
			if now.Sub(since) >= a.cfg.FailoverTimeout {
				continue
			}
		}
		for _, r := range s.Replicas {
			if r.Phase == "Pending" || r.Phase == "CreateBackOff" {
				continue // no container
			}
			key := reconcile.WorkloadKey(r.Namespace, r.Workload)
			if f.Held[key] == nil {
				f.Held[key] = map[int]bool{}
			}
			f.Held[key][r.Ordinal] = true
		}
	}
	return f, seen, len(known)
}

// fence applies the at-most-one rule to mine and logs quorum changes.
func (a *Agent) fence(v view, observed []reconcile.Container, mine []reconcile.Replica, now time.Time) []reconcile.Replica {
	f, seen, known := a.fencing(v, observed, now)
	a.mu.Lock()
	changed := f.Quorum != a.quorum
	a.quorum = f.Quorum
	a.mu.Unlock()
	if f.Unknown {
		return reconcile.Fence(mine, f)
	}
	if changed && f.Quorum {
		a.log.Info("quorum: this node sees a majority; StatefulSet replicas may run here", "seen", seen, "known", known)
	} else if changed {
		a.log.Warn("quorum lost: this node sees no majority; killing its StatefulSet replicas", "seen", seen, "known", known)
	}
	return reconcile.Fence(mine, f)
}

// quorumLoop pings every live member once a second and records the acks
// (see fencing); it asks for a reconcile when a member's answers start or
// stop counting.
func (a *Agent) quorumLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	fresh := map[string]bool{}
	for first := true; ; first = false {
		var wg sync.WaitGroup
		for _, m := range a.cluster.Members() {
			if m.Name == a.cfg.Name || (m.State != gossip.StateAlive && m.State != gossip.StateSuspect) {
				continue
			}
			wg.Add(1)
			go func(name string) {
				defer wg.Done()
				if _, err := a.cluster.Ping(name); err == nil {
					a.mu.Lock()
					a.lastAck[name] = time.Now()
					a.mu.Unlock()
				}
			}(m.Name)
		}
		wg.Wait()
		if first {
			close(a.pinged)
		}
		now := time.Now()
		changed := false
		a.mu.Lock()
		for name, at := range a.lastAck {
			if f := now.Sub(at) < a.cfg.FenceTimeout; f != fresh[name] {
				fresh[name], changed = f, true
			}
		}
		a.mu.Unlock()
		if changed || first {
			a.requestReconcile()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// hasQuorum is the quorum state of the last reconcile.
func (a *Agent) hasQuorum() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.quorum
}

// fenceKills makes the removal of StatefulSet replicas immediate (SIGKILL,
// no grace period) while the node has no quorum: the majority side will
// start replacements after --failover-timeout, and the old copy must be
// dead well before that.
func (a *Agent) fenceKills(v view, acts []reconcile.Action) {
	select {
	case <-a.pinged:
	default:
		return
	}
	if a.hasQuorum() {
		return
	}
	stateful := map[string]bool{}
	for _, o := range v.workloads {
		if o.Kind == manifest.KindStatefulSet {
			stateful[reconcile.WorkloadKey(o.Namespace, o.Name)] = true
		}
	}
	for i := range acts {
		act := &acts[i]
		if (act.Type == reconcile.Remove || act.Type == reconcile.Replace) && stateful[reconcile.WorkloadKey(act.Old.Namespace, act.Old.Workload)] {
			act.Old.GracePeriod = 0
			act.Reason = "fenced: no quorum"
		}
	}
}

// stopStatefulReplicas stops this node's StatefulSet replicas on a clean
// shutdown. Other containers keep running for the restarted agent to
// adopt, but a StatefulSet replica of a node that left starts elsewhere
// after --failover-timeout, and a stopped agent cannot fence: stopping it
// now keeps "at most one" through upgrades and restarts that take longer.
func (a *Agent) stopStatefulReplicas(ctx context.Context) {
	v, err := a.readView()
	if err != nil {
		return
	}
	observed, err := a.rt.List(ctx)
	if err != nil {
		a.log.Warn("stop StatefulSet replicas: list containers", "err", err)
		return
	}
	stateful := map[string]bool{}
	for _, o := range v.workloads {
		if o.Kind == manifest.KindStatefulSet {
			stateful[reconcile.WorkloadKey(o.Namespace, o.Name)] = true
		}
	}
	for _, c := range observed {
		if !stateful[reconcile.WorkloadKey(c.Namespace, c.Workload)] {
			continue
		}
		act := reconcile.Action{Type: reconcile.Remove, Old: c, Reason: "agent stopping: a StatefulSet replica must not outlive its fencing"}
		if err := a.rt.Execute(ctx, act); err != nil {
			a.log.Warn("stop StatefulSet replica", "replica", c.Name, "err", err)
			continue
		}
		a.log.Info("stopped StatefulSet replica before leaving", "replica", c.Name)
	}
}
