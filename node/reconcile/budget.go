package reconcile

import "sort"

// Strategy is a workload's update strategy, resolved to replica counts.
type Strategy struct {
	// Replicas is the desired replica count (ordinals 0..Replicas-1).
	Replicas int
	// Recreate replaces every old replica at once (strategy type
	// Recreate); otherwise the update is rolling.
	Recreate bool
	// MaxUnavailable is how many ordinals may be without a ready copy
	// because of the update (absolute; percentages resolved, rounding
	// down as Kubernetes does).
	MaxUnavailable int
	// MaxSurge is how many ordinals may run a new copy beside the old one
	// (absolute; percentages round up).
	MaxSurge int
	// Paused stops the update where it is: no old copy is replaced, and
	// ordinals without any copy are created with the current spec.
	Paused bool
	// Reverse updates the highest ordinal first (as StatefulSets do).
	Reverse bool
	// Ordered starts ordinal i only once ordinals 0..i-1 all have a ready
	// copy (StatefulSet podManagementPolicy OrderedReady).
	Ordered bool
}

// Copy is one existing copy of a replica, as the cluster view reports it:
// this node's from its own observation, other live nodes' from their
// gossiped status. Copies on dead nodes are not listed.
type Copy struct {
	Node     string
	Ordinal  int
	SpecHash string
	// Ready: running, ready, and not being stopped.
	Ready bool
}

// Budget is the input of Gate: the rolling-update budget of each workload and what counts against it.
type Budget struct {
	// Mine are this node's replicas as Owned returns them (current spec).
	Mine []Replica
	// Observed are the containers on this node.
	Observed []Container
	// Ready says whether one of this node's containers (by ID) is running
	// and ready.
	Ready func(id string) bool
	// Strategies are the workloads' strategies by WorkloadKey.
	Strategies map[string]Strategy
	// Copies are every known copy of each workload, by WorkloadKey.
	Copies map[string][]Copy
}

// WorkloadKey is the key of a workload in Budget maps: "namespace/name".
func WorkloadKey(namespace, workload string) string { return namespace + "/" + workload }

// Step is what Gate decided for one ordinal that still runs an old spec.
type Step string

// Gate decisions.
const (
	// StepWait keeps the old copy: the budget is spent by lower ordinals.
	StepWait Step = "wait"
	// StepSurge starts the new copy beside the old one; the old one stops
	// once the new one is ready.
	StepSurge Step = "surge"
	// StepReplace stops the old copy, then starts the new one.
	StepReplace Step = "replace"
	// StepStop stops the old copy and starts nothing yet (Recreate).
	StepStop Step = "stop"
)

// Gate applies the rolling-update budget (and, for Ordered workloads, the
// ordered start) to the replicas this node owns.
// It returns the replicas the node must run now: the current-spec ones it
// may start, plus the old-spec containers it must keep for now (Plan then
// removes the rest, pairing a removal with the start of the same ordinal
// into one Replace).
//
// There is no coordinator, lease or lock. Every node decides only for its
// own ordinals, in ordinal order, from its local view of the cluster:
//
//   - A replica with no copy at all starts at once, except that an Ordered
//     workload's ordinal waits until every lower ordinal has a ready copy.
//   - An ordinal is done when a ready copy of the current spec exists and
//     no copy of another spec does.
//   - An old copy that is not ready is replaced without spending the
//     unavailability budget (it costs no availability), still in ordinal
//     order: only when L < max(MaxSurge, MaxUnavailable). After an agent
//     restart no copy is ready until probed again, so this bound is what
//     keeps a restart from replacing everything.
//   - Recreate stops every old copy and starts new ones only once no old
//     copy is left anywhere in the view.
//   - Otherwise, with L the number of lower ordinals (higher when
//     Reverse) not done: if L <
//     MaxSurge the new copy starts beside the old one (surge); else if
//     L < MaxUnavailable and fewer than MaxUnavailable ordinals have no
//     ready copy (any cause: crash, image pull, probe, dead node), the
//     old copy is replaced; else it waits.
//   - A surging ordinal keeps its old copy until the new one is ready.
//
// Why stale views only delay: "done" is monotone for a given spec (a done
// ordinal has no old copy left to update), so a stale view sees fewer done
// ordinals than there are, a larger L, and decides more cautiously. Let
// i1 < ... < ik be the ordinals being replaced at one time; none of them
// was ever done, so when ik decided, L >= k-1, and L < MaxUnavailable
// gives k <= MaxUnavailable. Surges are bounded by MaxSurge the same way,
// so at most MaxUnavailable ordinals are down for the update and at most
// Replicas+MaxSurge copies exist. (Admitting MaxSurge+MaxUnavailable
// ordinals at once, as Kubernetes' central controller does, is not safe
// here: two nodes with different stale views could both take the same
// rank and both replace.) The cost: at most max(MaxSurge, MaxUnavailable)
// ordinals are updated at once, and a lower ordinal that stays unready
// (crash loop, no capacity) holds the update, as the rule asks.
// This is the ordered admission of Kubernetes' StatefulSet controller
// spread over the owners of each ordinal.
//
// A partly done update continues after any restart: every input is
// observed (containers, gossiped status), none remembered.
func Gate(in Budget) []Replica {
	old := map[slotKey][]Container{}
	local := map[string]Container{}
	for _, c := range in.Observed {
		local[c.ID] = c
		old[slotKey{c.Namespace, c.Workload, c.Ordinal}] = append(old[slotKey{c.Namespace, c.Workload, c.Ordinal}], c)
	}
	var out []Replica
	for _, r := range in.Mine {
		key := WorkloadKey(r.Namespace, r.Workload)
		var olds []Container
		for _, c := range old[slotKey{r.Namespace, r.Workload, r.Ordinal}] {
			// An old copy whose sandbox never finished cannot be kept
			// (Plan would rebuild it without its spec): replace it.
			if c.SpecHash != r.SpecHash && c.PodIP != "" {
				olds = append(olds, c)
			}
		}
		c, exists := local[r.ID]
		exists = exists && c.SpecHash == r.SpecHash
		if len(olds) == 0 {
			if !exists && in.Strategies[key].Ordered && !predecessorsReady(r.Ordinal, in.Copies[key]) {
				continue // OrderedReady: wait for the lower ordinals
			}
			if !exists && in.Strategies[key].Recreate && anyOther(r.SpecHash, in.Copies[key]) {
				continue // Recreate: no new copy while an old one runs anywhere
			}
			out = append(out, r)
			continue
		}
		if exists {
			// Surge in progress: keep the old copies until the new one is
			// ready.
			out = append(out, r)
			if !in.Ready(r.ID) {
				out = append(out, keep(olds, r.AtMostOne)...)
			}
			continue
		}
		oldReady := false
		for _, c := range olds {
			oldReady = oldReady || in.Ready(c.ID)
		}
		switch StepFor(in.Strategies[key], r.SpecHash, r.Ordinal, oldReady, in.Copies[key]) {
		case StepSurge:
			out = append(out, r)
			out = append(out, keep(olds, r.AtMostOne)...)
		case StepReplace:
			out = append(out, r)
		case StepStop:
			// Neither: Plan stops the old copy and starts nothing.
		default:
			out = append(out, keep(olds, r.AtMostOne)...)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

type slotKey struct {
	ns, workload string
	ordinal      int
}

// keep turns observed containers into replicas Plan leaves running;
// atMostOne carries the workload's kind, so Fence still applies to them.
func keep(cs []Container, atMostOne bool) []Replica {
	out := make([]Replica, 0, len(cs))
	for _, c := range cs {
		out = append(out, Replica{ID: c.ID, Name: c.Name, Namespace: c.Namespace, Workload: c.Workload,
			Ordinal: c.Ordinal, SpecHash: c.SpecHash, Spec: Spec{GracePeriod: c.GracePeriod}, AtMostOne: atMostOne})
	}
	return out
}

// anyOther reports whether copies hold a copy of another spec than hash.
func anyOther(hash string, copies []Copy) bool {
	for _, c := range copies {
		if c.SpecHash != hash {
			return true
		}
	}
	return false
}

// StepFor is the rolling-update rule for one ordinal that runs a copy of
// an old spec (see Gate): hash is the current spec, oldReady says whether
// the old copy is ready, copies are every known copy of the workload.
func StepFor(s Strategy, hash string, ordinal int, oldReady bool, copies []Copy) Step {
	if s.Recreate {
		return StepStop // the new copy starts once no old one is left
	}
	if s.Paused {
		return StepWait
	}
	type state struct{ current, currentReady, other, anyReady bool }
	ords := make([]state, s.Replicas)
	for _, c := range copies {
		if c.Ordinal < 0 || c.Ordinal >= s.Replicas {
			continue
		}
		st := &ords[c.Ordinal]
		if c.SpecHash == hash {
			st.current = true
			st.currentReady = st.currentReady || c.Ready
		} else {
			st.other = true
		}
		st.anyReady = st.anyReady || c.Ready
	}
	lower, unavailable := 0, 0
	for j, st := range ords {
		before := j < ordinal
		if s.Reverse {
			before = j > ordinal
		}
		if before && !(st.currentReady && !st.other) {
			lower++
		}
		if !st.anyReady && (j != ordinal || oldReady) {
			// This ordinal's own unready old copy costs nothing to replace.
			unavailable++
		}
	}
	if !oldReady {
		// No availability to lose: only the ordinal order limits it.
		if lower < max(s.MaxSurge, s.MaxUnavailable) {
			return StepReplace
		}
		return StepWait
	}
	switch {
	case lower < s.MaxSurge:
		return StepSurge
	case lower < s.MaxUnavailable && unavailable < s.MaxUnavailable:
		return StepReplace
	default:
		return StepWait
	}
}

// predecessorsReady reports whether every ordinal below ordinal has a
// ready copy.
func predecessorsReady(ordinal int, copies []Copy) bool {
	ready := make([]bool, ordinal)
	for _, c := range copies {
		if c.Ordinal >= 0 && c.Ordinal < ordinal && c.Ready {
			ready[c.Ordinal] = true
		}
	}
	for _, r := range ready {
		if !r {
			return false
		}
	}
	return true
}
