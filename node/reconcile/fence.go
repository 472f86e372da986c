package reconcile

import "sort"

// Fencing is the input of Fence.
type Fencing struct {
	// Quorum says this node sees a strict majority of the cluster's known
	// nodes alive (itself included).
	Quorum bool
	// Unknown says the quorum is not known yet (the node just started):
	// replicas already running here stay, none starts.
	Unknown bool
	// Occupied lists, by WorkloadKey, the ordinals a copy on another node may
	// still occupy: a live node reports one, or a node that is down
	// reported one and went down less than the failover timeout ago.
	Occupied map[string]map[int]bool
	// Observed are the containers on this node.
	Observed []Container
}

// Fence applies the at-most-one rule to this node's replicas (Owned and
// Gate's result) and returns what it may run. Other replicas pass
// unchanged. An AtMostOne replica
//   - is dropped when the node has no quorum (Plan then removes its
//     container: the minority side of a partition runs none), and while
//     the quorum is Unknown only kept if it already runs here;
//   - stays if its ordinal already runs here (a task running, or created);
//   - otherwise starts only if no other node may still hold its ordinal.
//
// Why at most one: a replica starts only on a node with a majority, and
// only once every other copy is gone from the status of live nodes or
// its node has been down for the failover timeout. A node cut off loses
// its majority and kills its copies; the failover timeout is chosen well
// above the time that takes, so by the time the majority side starts a
// replacement, the old copy is dead. Two majorities cannot exist at once.
func Fence(mine []Replica, in Fencing) []Replica {
	// A copy runs here when its task runs, or when its create is under
	// way (Created): an exited copy (crashed, or killed by the fence
	// watchdog while the agent was away) is no claim on the ordinal, and
	// restarts only as a new start would.
	here := map[slotKey]bool{}
	for _, c := range in.Observed {
		if c.State == StateRunning || c.State == StateCreated {
			here[slotKey{c.Namespace, c.Workload, c.Ordinal}] = true
		}
	}
	var out []Replica
	for _, r := range mine {
		if !r.AtMostOne {
			out = append(out, r)
			continue
		}
		running := here[slotKey{r.Namespace, r.Workload, r.Ordinal}]
		if in.Unknown && !running || !in.Unknown && !in.Quorum {
			continue
		}
		if !running && in.Occupied[WorkloadKey(r.Namespace, r.Workload)][r.Ordinal] {
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Majority reports whether seen of known nodes is a strict majority.
func Majority(seen, known int) bool { return 2*seen > known }
