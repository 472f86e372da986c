package placement

import (
	"cmp"
)

// assignReference is the obvious implementation of Assign's rules, kept
// as a test oracle and as the "before" of the benchmarks: every replica
// ranks all nodes with a full sort and walks the list. Assign must give the
// same Owners and the same pending replicas.
func assignReference(nodes []Node, workloads []Workload, opts Options) Placement {
	ns := canonicalNodes(nodes)
	ws := canonicalWorkloads(workloads)
	total := 0
	for _, w := range ws {
		total += max(w.Replicas, 0)
	}
	bound := bounds(ns, total, opts.LoadFactor)
	load := make([]int, len(ns))
	usedCPU := make([]int64, len(ns))
	usedMem := make([]int64, len(ns))
	fitsOne := func(alloc, used, req int64) bool {
		return req <= 0 || alloc == 0 || used+req <= alloc
	}

	type rep struct {
		w, ord int
		rank   []int // all nodes, best first
		top    int   // first node in rank matching the selector, or -1
		score  float64
		h      uint64
	}
	var reps []rep
	p := Placement{Owners: map[string][]string{}, Pending: map[string]map[int]string{}}
	for wi, w := range ws {
		p.Owners[w.Key] = make([]string, max(w.Replicas, 0))
		for ord := range max(w.Replicas, 0) {
			rh := replicaHash(w.Key, ord)
			r := rep{w: wi, ord: ord, rank: rankIndices(ns, rh), top: -1}
			for _, i := range r.rank {
				if matches(ns[i].labels, w.NodeSelector) {
					r.top = i
					r.h = pairHash(ns[i].hash, rh)
					r.score = score(ns[i].weight, r.h)
					break
				}
			}
			reps = append(reps, r)
		}
	}
	// The same order as Assign, spelled out: among the next ordinal of
	// every workload, the first by claim; ordinals of one workload in
	// ascending order.
	claim := func(a, b rep) int {
		if (a.top < 0) != (b.top < 0) {
			if a.top < 0 {
				return 1
			}
			return -1
		}
		if (len(ws[a.w].NodeSelector) > 0) != (len(ws[b.w].NodeSelector) > 0) {
			if len(ws[a.w].NodeSelector) > 0 {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(b.h, a.h), cmp.Compare(a.w, b.w), cmp.Compare(a.ord, b.ord))
	}
	var ordered []rep
	next := map[int]int{} // workload -> next ordinal
	for len(ordered) < len(reps) {
		best := -1
		for i, r := range reps {
			if r.ord != next[r.w] {
				continue
			}
			if best < 0 || claim(r, reps[best]) < 0 {
				best = i
			}
		}
		ordered = append(ordered, reps[best])
		next[reps[best].w]++
	}
	reps = ordered

	held := make(map[[2]int]int) // (workload, node) -> replicas
	for _, r := range reps {
		w := ws[r.w]
		eligible := func(i int) bool {
			return matches(ns[i].labels, w.NodeSelector) &&
				load[i] < bound[i] &&
				fitsOne(ns[i].alloc.MilliCPU, usedCPU[i], w.Requests.MilliCPU) &&
				fitsOne(ns[i].alloc.MemoryBytes, usedMem[i], w.Requests.MemoryBytes)
		}
		minHeld := -1
		for _, i := range r.rank {
			if eligible(i) && (minHeld < 0 || held[[2]int{r.w, i}] < minHeld) {
				minHeld = held[[2]int{r.w, i}]
			}
		}
		owner := -1
		for _, i := range r.rank {
			if eligible(i) && held[[2]int{r.w, i}] == minHeld {
				owner = i
				break
			}
		}
		if owner < 0 {
			if p.Pending[w.Key] == nil {
				p.Pending[w.Key] = map[int]string{}
			}
			p.Pending[w.Key][r.ord] = "pending"
			continue
		}
		load[owner]++
		held[[2]int{r.w, owner}]++
		usedCPU[owner] += max(w.Requests.MilliCPU, 0)
		usedMem[owner] += max(w.Requests.MemoryBytes, 0)
		p.Owners[w.Key][r.ord] = ns[owner].name
	}
	return p
}
