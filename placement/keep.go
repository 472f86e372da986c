package placement

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"
)

// Holder says that a node holds a copy of a replica: ordinal of workload
// Key has a copy on Node, created at Since (as the nodes report it; zero
// when not known or not created yet), running or not (exited, crashing,
// being created or replaced).
type Holder struct {
	Key     string
	Ordinal int
	Node    string
	Since   time.Time
	Running bool
}

// Keep returns p, the result of Assign(nodes, workloads, opts), with
// replicas left on nodes that run them: a replica whose owner in p does
// not run it, while another node does, stays on that node if it
//   - is among nodes and carries every label of the workload's
//     NodeSelector,
//   - holds fewer replicas than its load bound (Options.LoadFactor),
//     counting p's replicas and those kept before,
//   - has the replica's Requests left in its Allocatable,
//   - holds fewer replicas of the workload than ceil(replicas / nodes
//     matching the selector): replicas stay spread, and
//   - is the node the replica is pinned to, if it is (Workload.Pinned).
//
// Rendezvous hashing alone moves a replica back to a node that returns
// (a restart, a healed partition), and bounded loads move one or two
// more per replica (Stability tests): each move restarts a replica and
// tells every node twice or more. Kubernetes moves nothing back either
// (rebalancing is the descheduler's, off by default). The load bound
// still rebalances: where the nodes left cannot keep what they took
// (3 nodes, 6 replicas: a returning node's peers are over their bound of
// 2), the replicas go back. The node p gives a kept replica ends up with
// fewer replicas; nothing else moves.
//
// Several copies of one replica (a healed partition, a returning node
// that started its share before it heard who took it) are tried running
// copies first, each group oldest first (by Since; unknown last, then in
// Rank order): the first that
// passes the tests keeps the replica, or, when the first to pass is
// p's owner's, the replica stays with p's owner. The others stop.
// Holders of replicas that do not exist and unknown nodes are ignored.
// Replicas are taken by workload key, then ordinal, so the result
// depends only on the inputs, not on their order. A replica p left
// unplaced (Pending) may be kept too. p is not modified: the workloads
// whose owners change get new slices.
//
// Cost: O(nodes + replicas of p + holders log holders) and at most
// keepPasses passes over the held replicas p places elsewhere.
func Keep(p Placement, nodes []Node, workloads []Workload, holders []Holder, opts Options) Placement {
	if len(holders) == 0 {
		return p
	}
	ns := canonicalNodes(nodes)
	index := make(map[string]int, len(ns))
	for i, n := range ns {
		index[n.name] = i
	}
	ws := canonicalWorkloads(workloads)
	byKey := make(map[string]*Workload, len(ws))
	total := 0
	for i := range ws {
		byKey[ws[i].Key] = &ws[i]
		total += max(ws[i].Replicas, 0)
	}
	// Each slot's holders (known nodes, replicas that exist), the
	// oldest copy of each node's.
	type slot struct {
		key     string
		ordinal int
	}
	type copyOf struct {
		node    int
		since   time.Time
		running bool
	}
	bySlot := map[slot][]copyOf{}
	for _, h := range holders {
		w, ok := byKey[h.Key]
		i, known := index[h.Node]
		if !ok || !known || h.Ordinal < 0 || h.Ordinal >= w.Replicas {
			continue
		}
		s := slot{h.Key, h.Ordinal}
		if j := slices.IndexFunc(bySlot[s], func(c copyOf) bool { return c.node == i }); j < 0 {
			bySlot[s] = append(bySlot[s], copyOf{i, h.Since, h.Running})
		} else {
			c := &bySlot[s][j] // the node's best copy: running, then oldest
			if h.Running && !c.running || h.Running == c.running && older(h.Since, c.since) {
				c.since, c.running = h.Since, h.Running
			}
		}
	}
	var slots []slot
	for s, hs := range bySlot {
		if owner := p.Owner(s.key, s.ordinal); len(hs) > 1 || ns[hs[0].node].name != owner {
			slots = append(slots, s)
		}
	}
	if len(slots) == 0 {
		return p
	}
	slices.SortFunc(slots, func(a, b slot) int {
		return cmp.Or(strings.Compare(a.key, b.key), cmp.Compare(a.ordinal, b.ordinal))
	})

	// What p puts on each node: replicas, resources, and replicas of
	// each workload a slot names.
	s := newAssigner(ns, bounds(ns, total, opts.LoadFactor))
	perWorkload := map[string][]int{}
	for _, sl := range slots {
		perWorkload[sl.key] = nil
	}
	for _, w := range ws {
		req := requests(w)
		_, counted := perWorkload[w.Key]
		var counts []int
		if counted {
			counts = make([]int, len(ns))
			perWorkload[w.Key] = counts
		}
		for _, o := range p.Owners[w.Key] {
			if i, ok := index[o]; ok {
				s.take(i, req)
				if counted {
					counts[i]++
				}
			}
		}
	}

	out := Placement{Owners: maps.Clone(p.Owners), Pending: p.Pending}
	copied := map[string]bool{}
	spreads := map[string]int{} // by workload key: ceil(replicas / matching nodes)
	// settle tries the copies of sl in order; it reports false when none
	// may keep it yet (a later pass tries again).
	settle := func(sl slot) bool {
		w := byKey[sl.key]
		req := requests(*w)
		sel := s.selector(w.NodeSelector)
		spread, ok := spreads[sl.key]
		if !ok {
			matching := len(ns)
			if sel != nil {
				matching = 0
				for _, m := range sel {
					if m {
						matching++
					}
				}
			}
			spread = (w.Replicas + matching - 1) / max(matching, 1)
			spreads[sl.key] = spread
		}
		counts := perWorkload[sl.key]
		owner := p.Owner(sl.key, sl.ordinal)
		pin, pinned := w.Pinned[sl.ordinal]
		for _, c := range bySlot[sl] {
			i := c.node
			if ns[i].name == owner {
				return true // p's owner runs it: it stays there
			}
			if pinned && ns[i].name != pin {
				continue // its data is on another node: never kept elsewhere
			}
			if (sel != nil && !sel[i]) || !s.fits(i, req) || counts[i] >= spread {
				continue
			}
			if !copied[sl.key] {
				out.Owners[sl.key] = slices.Clone(p.Owners[sl.key])
				copied[sl.key] = true
			}
			if o, ok := index[owner]; ok {
				s.give(o, req)
				counts[o]--
			} else if out.Pending[sl.key] != nil {
				out.Pending = unpend(out.Pending, sl.key, sl.ordinal)
			}
			s.take(i, req)
			counts[i]++
			out.Owners[sl.key][sl.ordinal] = ns[i].name
			return true
		}
		return false
	}
	for _, sl := range slots {
		rh := replicaHash(sl.key, sl.ordinal)
		slices.SortFunc(bySlot[sl], func(a, b copyOf) int {
			if a.running != b.running {
				if a.running {
					return -1
				}
				return 1
			}
			if older(a.since, b.since) {
				return -1
			}
			if older(b.since, a.since) {
				return 1
			}
			ha, hb := pairHash(ns[a.node].hash, rh), pairHash(ns[b.node].hash, rh)
			return cmp.Or(cmp.Compare(score(ns[b.node].weight, hb), score(ns[a.node].weight, ha)), cmp.Compare(hb, ha), cmp.Compare(a.node, b.node))
		})
	}
	// Passes until one settles nothing more (at most keepPasses): a
	// replica kept away from the node p gives it makes room there for
	// one that node holds.
	for pass, progress := 0, true; progress && pass < keepPasses; pass++ {
		progress = false
		rest := slots[:0]
		for _, sl := range slots {
			if settle(sl) {
				progress = true
			} else {
				rest = append(rest, sl)
			}
		}
		slots = rest
	}
	return out
}

// keepPasses bounds Keep's passes over the held replicas. Each pass
// after the first keeps those for which the one before made room; the
// 100-node return of TestReturningNodeTakesNothingBackWhereTheOthersCanKeepIt
// needs 4.
const keepPasses = 8

// older reports whether a is before b, a zero time (not known) being
// after every other.
func older(a, b time.Time) bool {
	return !a.IsZero() && (b.IsZero() || a.Before(b))
}

// requests is w's Requests clamped to >= 0, as Assign reads them.
func requests(w Workload) Resources {
	return Resources{MilliCPU: max(w.Requests.MilliCPU, 0), MemoryBytes: max(w.Requests.MemoryBytes, 0)}
}

// give undoes take: node i holds one replica of req fewer.
func (s *assigner) give(i int, req Resources) {
	s.load[i]--
	if s.freeCPU[i] != unlimited {
		s.freeCPU[i] += req.MilliCPU
	}
	if s.freeMem[i] != unlimited {
		s.freeMem[i] += req.MemoryBytes
	}
}

// unpend returns pending without ordinal of key, copying what it changes
// (pending is shared with the Placement it came from).
func unpend(pending map[string]map[int]string, key string, ordinal int) map[string]map[int]string {
	out := maps.Clone(pending)
	m := maps.Clone(out[key])
	delete(m, ordinal)
	if len(m) == 0 {
		delete(out, key)
	} else {
		out[key] = m
	}
	return out
}
