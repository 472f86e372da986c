package reconcile

import (
	"math/bits"
	"sort"

	"github.com/starling-orchestrator/starling/placement"
)

// Fencing is the input of Fence.
type Fencing struct {
	// Quorum says this node sees a strict majority of the cluster's known
	// nodes alive (itself included).
	Quorum bool
	// Unknown says the quorum is not known yet (the node just started):
	// replicas already running here stay, none starts.
	Unknown bool
	// Held lists, by WorkloadKey, the ordinals a copy on another node may
	// still occupy: a live node reports one, or a node that is down
	// reported one and went down less than the failover timeout ago.
	Held map[string]map[int]bool
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
		if !running && in.Held[WorkloadKey(r.Namespace, r.Workload)][r.Ordinal] {
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Majority reports whether seen of known nodes is a strict majority.
func Majority(seen, known int) bool { return 2*seen > known }

// Witnesses returns the nodes whose answers make a quorum for fencing,
// from the known nodes (names, any order; duplicates count once): all of
// them up to 7 known nodes, else the 2*ceil(log2(N))+1 of them placement's
// rendezvous hashing ranks first for the key "starling/fence-witnesses"
// (9 at 16 nodes, 15 at 100, 21 at 1,000), sorted by name. A node has
// quorum when it and the witnesses that answer it are a strict majority
// of the witnesses (Majority(seen, len(witnesses))).
//
// Why it is safe: every node that knows the same nodes picks the same
// witnesses, and two strict majorities of one set always share a witness,
// which answers on one side of a partition only; so at most one side has
// a quorum, as with a majority of all known nodes, which is what the
// witnesses are up to 7 nodes. What it costs: the side that holds a
// majority of the witnesses keeps its StatefulSet replicas, which past 7
// nodes need not be the side with most nodes (as in Kubernetes, where the
// side with the etcd quorum is the one that goes on). What it saves: each
// node pings O(log N) witnesses a second instead of every node, N*(N-1)
// pings a second cluster-wide (a million at 1,000 nodes).
func Witnesses(known []string) []string {
	nodes := make([]placement.Node, 0, len(known))
	seen := map[string]bool{}
	for _, n := range known {
		if !seen[n] {
			seen[n] = true
			nodes = append(nodes, placement.Node{Name: n})
		}
	}
	k := len(nodes)
	if k > maxAllWitnesses {
		k = min(k, 2*bits.Len(uint(k-1))+1)
	}
	out := placement.Rank(nodes, "starling/fence-witnesses", 0)[:k]
	sort.Strings(out)
	return out
}

// maxAllWitnesses is the cluster size up to which every known node is a
// witness.
const maxAllWitnesses = 7
