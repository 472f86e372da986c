package reconcile

import "time"

// Decision is everything one reconcile pass of a node decides from: the
// cluster as its snapshot shows it, what runs on the node, what it knows
// of its quorum, and the time. Decide is a pure function of it, driven by
// table and property tests without sockets or root, as etcd's raft is
// driven through Ready.
type Decision struct {
	// Ownership is Owned's input (placement, make-before-break
	// handoffs); its Observed are the node's containers, which every step
	// below sees.
	Ownership Ownership
	// Rollout is Gate's input but for Mine and Observed, which Decide
	// fills in (the owned replicas, the containers).
	Rollout Rollout
	// Fencing is Fence's input but for Observed, which Decide fills in.
	Fencing Fencing
	// Stateful lists the StatefulSet workloads by WorkloadKey; their stops
	// last at most StatefulGrace (a stop begun before a partition must end
	// before the majority starts a replacement), and none when the node
	// is fenced (killed at once).
	Stateful      map[string]bool
	StatefulGrace time.Duration
}

// Output is what Decide decided.
type Output struct {
	// Mine are the replicas this node runs now: owned, held to their
	// rolling-update budget and to at most one copy. Its status record
	// lists them.
	Mine []Replica
	// Handoffs are the make-before-break handoffs to remember for the
	// next pass (Owned).
	Handoffs map[string]time.Time
	// Fenced: the node knows it has no quorum (its StatefulSet replicas
	// are killed).
	Fenced bool
	// Actions and Requeue are Plan's, with StatefulSet stops bounded.
	Actions []Action
	Requeue time.Duration
}

// Decide composes one pass: Owned (what placement and handoffs give this
// node), Gate (rolling updates within maxSurge/maxUnavailable), Fence (at
// most one copy of a StatefulSet ordinal), then Plan against the
// observed containers at now; StatefulSet stops are bounded by
// StatefulGrace, and immediate when fenced. Requeue is at most 1 s while
// a handoff is under way (the new owner's readiness is watched closely).
func Decide(d Decision, now time.Time) Output {
	observed := d.Ownership.Observed
	owned, handoffs := Owned(d.Ownership)
	r := d.Rollout
	r.Mine, r.Observed = owned, observed
	gated := Gate(r)
	f := d.Fencing
	f.Observed = observed
	out := Output{Mine: Fence(gated, f), Handoffs: handoffs, Fenced: !f.Unknown && !f.Quorum}
	res := Plan(out.Mine, observed, now)
	for i := range res.Actions {
		act := &res.Actions[i]
		if act.Type != Remove && act.Type != Replace && act.Type != Stop || !d.Stateful[WorkloadKey(act.Old.Namespace, act.Old.Workload)] {
			continue
		}
		act.Old.GracePeriod = min(act.Old.GracePeriod, d.StatefulGrace)
		if out.Fenced {
			act.Old.GracePeriod = 0
			act.Reason = "fenced: no quorum"
		}
	}
	out.Actions, out.Requeue = res.Actions, res.Requeue
	if len(handoffs) > 0 && (out.Requeue == 0 || out.Requeue > time.Second) {
		out.Requeue = time.Second
	}
	return out
}
