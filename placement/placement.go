// Package placement decides, without a coordinator, which node owns each
// replica: every node runs Assign on the same inputs (the live nodes from
// membership, the workloads from the replicated desired state) and gets the
// same answer, so each runs exactly the replicas it owns.
//
// Assign is a pure function: no I/O, no clock, no randomness beyond hashing
// and no global state. Its result depends on the set of nodes and
// workloads, never on their order in the input slices, and it is bit for
// bit the same on every architecture (see portableLog).
//
// The method is weighted rendezvous (highest-random-weight) hashing
// (Thaler and Ravishankar, "Using name-based mappings to increase hit
// rates", IEEE/ACM ToN 1998; weights by the logarithmic method of
// Schindelhauer and Schomaker, "Weighted distributed hash tables", SPAA
// 2005), with the load of each node bounded as in consistent hashing with
// bounded loads (Mirrokni, Thorup and Zadimoghaddam, SODA 2018): each
// replica goes to the highest-ranked node for it that can still take it.
// Keep then leaves replicas on the nodes that run them while those can
// keep them, so that a node's return moves little (keep.go).
package placement

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// DefaultLoadFactor is the load factor c (1+epsilon in Mirrokni et al.)
// used when Options.LoadFactor is zero: no node holds more than 1.25 times
// its weighted share of all replicas. Lower values balance better and move
// more replicas when membership changes; TestBalance and
// TestStabilityWhenOneNodeLeaves log the figures.
const DefaultLoadFactor = 1.25

// Resources are amounts of CPU and memory.
type Resources struct {
	MilliCPU    int64 // thousandths of a CPU core
	MemoryBytes int64 // bytes
}

// Node is one live node that may receive replicas.
type Node struct {
	// Name identifies the node; unique in the cluster. Nodes with an empty
	// name are ignored (an empty owner means "unplaced").
	Name string
	// Weight is the node's relative share of replicas. Zero, negative,
	// NaN and infinite weights count as 1.
	Weight float64
	// Labels are matched by Workload.NodeSelector.
	Labels map[string]string
	// Allocatable is what replicas may request in total on this node. A
	// zero field means that resource is unlimited; a negative field means
	// nothing that requests it fits.
	Allocatable Resources
}

// Workload is a set of identical replicas, numbered by ordinal 0..Replicas-1.
type Workload struct {
	Key      string // "namespace/name", unique among workloads
	Replicas int    // number of replicas; <= 0 means none
	// Requests is what one replica reserves on its node. Zero or negative
	// fields request nothing.
	Requests Resources
	// NodeSelector lists labels a node must all carry to run a replica.
	NodeSelector map[string]string
	// Pinned names, for some ordinals, the one node that may run them
	// (ordinal -> node name): a replica whose data lives on that node
	// (a local volume). It goes there or nowhere: past the node's load
	// bound, never past its Allocatable or the NodeSelector, and Pending
	// naming the node when the node is not among the nodes.
	Pinned map[int]string
}

// Options tunes Assign. The zero value gives the defaults.
type Options struct {
	// LoadFactor is c in the load bound: node i holds at most
	// max(ceil(s_i), floor(c*s_i)) replicas, where s_i = total replicas *
	// w_i / sum(w) is its weighted share. Values below 1 act as 1; zero,
	// negative and NaN mean DefaultLoadFactor; +Inf removes the bound
	// (plain rendezvous hashing).
	//
	// The bound counts all replicas on all nodes, whatever the selectors:
	// a workload whose nodeSelector matches few nodes can find them at
	// their bound and stay Pending although they have resources left.
	// Placing replicas with a selector first (see claimOrder) makes this
	// rare, not impossible.
	LoadFactor float64
}

// Placement is the result of Assign.
type Placement struct {
	// Owners maps each workload key to the owner node name of each
	// ordinal, "" for an ordinal placed nowhere. The slice has length
	// Replicas (empty, not nil, when Replicas <= 0).
	Owners map[string][]string
	// Pending maps the key of each workload with unplaced replicas to, per
	// unplaced ordinal, the reason in the Kubernetes scheduler's style:
	// "0/5 nodes are available: 2 node(s) didn't match nodeSelector,
	// 3 insufficient cpu". A node may count under several causes.
	Pending map[string]map[int]string
}

// Slot names one replica: a workload key and an ordinal.
type Slot struct {
	Key     string
	Ordinal int
}

// Owner returns the node that owns ordinal of workload key, or "" when the
// replica is unplaced or does not exist.
func (p Placement) Owner(key string, ordinal int) string {
	o := p.Owners[key]
	if ordinal < 0 || ordinal >= len(o) {
		return ""
	}
	return o[ordinal]
}

// OwnedBy returns the replicas node owns, sorted by key then ordinal. It
// scans every replica: O(total replicas).
func (p Placement) OwnedBy(node string) []Slot {
	var out []Slot
	if node == "" {
		return out
	}
	for key, owners := range p.Owners {
		for ord, o := range owners {
			if o == node {
				out = append(out, Slot{Key: key, Ordinal: ord})
			}
		}
	}
	slices.SortFunc(out, func(a, b Slot) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), cmp.Compare(a.Ordinal, b.Ordinal))
	})
	return out
}

// Rank returns the names of all nodes (after the de-duplication Assign
// applies) ordered by weighted rendezvous score for replica ordinal of
// workload key, best first: the order in which Assign tries nodes for that
// replica, before labels, resources, spread and load bounds rule any out.
// A prefix of it is the failover and handoff order. Ties (equal scores) go
// to the higher raw hash, then to the smaller name.
func Rank(nodes []Node, key string, ordinal int) []string {
	ns := canonicalNodes(nodes)
	order := rankIndices(ns, replicaHash(key, ordinal))
	out := make([]string, len(order))
	for i, idx := range order {
		out[i] = ns[idx].name
	}
	return out
}

// rankIndices returns the indices of ns sorted by (score desc, hash desc,
// index asc), the canonical order every selection in this package follows.
func rankIndices(ns []node, rh uint64) []int {
	type ranked struct {
		idx   int
		score float64
		h     uint64
	}
	rs := make([]ranked, len(ns))
	for i := range ns {
		h := pairHash(ns[i].hash, rh)
		rs[i] = ranked{idx: i, score: score(ns[i].weight, h), h: h}
	}
	slices.SortFunc(rs, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(b.h, a.h), cmp.Compare(a.idx, b.idx))
	})
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = r.idx
	}
	return out
}

// Assign places every replica of workloads on nodes. It never fails and
// never panics; replicas that fit nowhere are left "" in Owners and listed
// in Pending with the reason.
//
// Each replica goes to the first node in its Rank order that
//   - carries every label of the workload's NodeSelector,
//   - has the replica's Requests left in its Allocatable (never overcommitted),
//   - holds fewer replicas than its load bound (see Options.LoadFactor), and
//   - holds the fewest replicas of this workload among the nodes passing the
//     first three tests, so replicas spread over distinct nodes, and a
//     node gets a second replica of a workload only when every node able
//     to take one already has one.
//
// Replicas are placed one at a time: those with a nodeSelector first, then
// strongest claim first (the score of their best node among those matching
// the selector), ties by workload key and ordinal. See claimOrder for why
// not simply by key.
//
// Duplicates: nodes with the same Name, or workloads with the same Key,
// are sorted by all their fields and the first kept, so the choice does
// not depend on input order. The load bound counts the replicas of the
// kept workloads only.
func Assign(nodes []Node, workloads []Workload, opts Options) Placement {
	ns := canonicalNodes(nodes)
	ws := canonicalWorkloads(workloads)
	total := 0
	for _, w := range ws {
		total += max(w.Replicas, 0)
	}
	s := newAssigner(ns, bounds(ns, total, opts.LoadFactor))
	p := Placement{
		Owners:  make(map[string][]string, len(ws)),
		Pending: make(map[string]map[int]string),
	}
	// One backing array each for owners and for holders/counts, carved
	// per workload with capped slices (an append by the caller copies).
	spread := 0
	for _, w := range ws {
		spread += min(max(w.Replicas, 0), len(ns))
	}
	ownerBuf := make([]string, total)
	holderBuf := make([]int, 2*spread)
	states := make([]workloadState, len(ws))
	reps := make([]replica, 0, total)
	short := make([][shortlistLen]int32, 0, total)
	for wi, w := range ws {
		n := max(w.Replicas, 0)
		owners := ownerBuf[:n:n]
		ownerBuf = ownerBuf[n:]
		p.Owners[w.Key] = owners
		if n == 0 {
			continue
		}
		st := &states[wi]
		st.sel = s.selector(w.NodeSelector)
		st.req = requests(w)
		k := min(n, len(ns))
		st.holders, st.counts = holderBuf[:0:k], holderBuf[k:k:2*k]
		holderBuf = holderBuf[2*k:]
		s.placePinned(w, st, owners, p)
		for ord := range owners {
			if _, pinned := w.Pinned[ord]; pinned {
				continue
			}
			rh := replicaHash(w.Key, ord)
			r := replica{workload: wi, ordinal: ord, hash: rh, shortlist: len(short), constrained: st.sel != nil}
			short = append(short, [shortlistLen]int32{})
			r.top, r.shortlen = s.shortlist(rh, st.sel, &short[r.shortlist])
			reps = append(reps, r)
		}
	}
	for _, r := range placementOrder(reps) {
		w, st := &ws[r.workload], &states[r.workload]
		i := -1
		if r.shortlen > 0 {
			i = s.pick(r, short[r.shortlist][:r.shortlen], st)
		}
		if i < 0 {
			if p.Pending[w.Key] == nil {
				p.Pending[w.Key] = make(map[int]string)
			}
			p.Pending[w.Key][r.ordinal] = s.reason(st.sel, st.req)
			continue
		}
		s.take(i, st.req)
		st.hold(i)
		p.Owners[w.Key][r.ordinal] = ns[i].name
	}
	return p
}

// workloadState is what Assign tracks per workload while placing.
type workloadState struct {
	sel     []bool    // nodes matching the selector; nil means all
	req     Resources // per replica, clamped to >= 0
	holders []int     // nodes holding replicas of the workload
	counts  []int     // replicas on each of holders
}

// hold counts one more replica of the workload on node i.
func (st *workloadState) hold(i int) {
	if j := slices.Index(st.holders, i); j >= 0 {
		st.counts[j]++
		return
	}
	st.holders = append(st.holders, i)
	st.counts = append(st.counts, 1)
}

// replica is one replica to place.
type replica struct {
	workload  int    // index into the canonical workloads
	ordinal   int    // 0..Replicas-1
	hash      uint64 // replicaHash(key, ordinal)
	top       choice // its best node by selector alone; idx -1 if none
	shortlist int    // index of its shortlist in Assign's short
	shortlen  int    // entries used in the shortlist
	// constrained is true when the workload has a nodeSelector.
	constrained bool
}

// placementOrder returns reps (grouped by workload, each group in ordinal
// order) in the order Assign places them: a merge of the workloads'
// ordinal sequences that always takes, among the next ordinal of every
// workload, the first by claimOrder. Within a workload ordinals go in
// ascending order, so the placement of ordinals 0..k-1 never depends on
// how many more the workload has: changing only a workload's replicas
// moves none of its other replicas (unless a node's load bound, which
// counts all replicas, is what kept one away).
func placementOrder(reps []replica) []replica {
	if len(reps) == 0 {
		return nil
	}
	// heads holds the index in reps of each workload's next ordinal.
	var heads []int
	for i := range reps {
		if i == 0 || reps[i].workload != reps[i-1].workload {
			heads = append(heads, i)
		}
	}
	less := func(a, b int) bool { return claimOrder(reps[heads[a]], reps[heads[b]]) < 0 }
	h := &indexHeap{less: less}
	for i := range heads {
		h.items = append(h.items, i)
	}
	h.init()
	out := make([]replica, 0, len(reps))
	for len(h.items) > 0 {
		w := h.items[0]
		out = append(out, reps[heads[w]])
		heads[w]++
		if heads[w] < len(reps) && reps[heads[w]].workload == reps[heads[w]-1].workload {
			h.fix0()
		} else {
			h.pop0()
		}
	}
	return out
}

// indexHeap is a binary min-heap of ints under less (container/heap
// without the interface boxing, on the placement hot path).
type indexHeap struct {
	items []int
	less  func(a, b int) bool
}

func (h *indexHeap) init() {
	for i := len(h.items)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *indexHeap) fix0() { h.down(0) }

func (h *indexHeap) pop0() {
	last := len(h.items) - 1
	h.items[0] = h.items[last]
	h.items = h.items[:last]
	if last > 0 {
		h.down(0)
	}
}

func (h *indexHeap) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		j := l
		if r := l + 1; r < n && h.less(h.items[r], h.items[l]) {
			j = r
		}
		if !h.less(h.items[j], h.items[i]) {
			return
		}
		h.items[i], h.items[j] = h.items[j], h.items[i]
		i = j
	}
}

// claimOrder is the order Assign places replicas in: replicas with a
// nodeSelector first, then by the strength of their claim on their best
// node (score descending), then by workload and ordinal; replicas that no
// node matches go last.
//
// Selector first (most constrained first, as in bin packing): the load
// bound is global, so replicas free to go anywhere could otherwise take
// the last slots of the few nodes a selector allows. On the mixed
// benchmark cluster (half the nodes in zone a, a quarter of the workloads
// pinned there) this leaves 0 replicas pending instead of 55.
//
// Strongest claim next, rather than key order: in key order a replica
// that takes its first choice can fill a node that a later replica scoring
// higher there wanted, and when a node leaves each of its replicas that
// lands on a full node pushes the next replica in key order out, and so
// on. Strongest claim first approximates the stable matching in which
// every node keeps the replicas that score highest on it (Gale and Shapley
// 1962, both sides ranking by the same score; computing that matching
// exactly measured the same churn): an orphan arrives with the weaker claim
// of its second choice, is usually outbid at a full node and walks on. At
// 100 nodes, 1,000 replicas and c = 1.25, over each node leaving in turn,
// moved/orphaned is 1.44 mean, 2.20 worst, against 1.53 and 2.63 in key
// order.
func claimOrder(a, b replica) int {
	if (a.shortlen == 0) != (b.shortlen == 0) {
		if a.shortlen == 0 {
			return 1
		}
		return -1
	}
	if a.constrained != b.constrained {
		if a.constrained {
			return -1
		}
		return 1
	}
	return cmp.Or(
		cmp.Compare(b.top.score, a.top.score),
		cmp.Compare(b.top.h, a.top.h),
		cmp.Compare(a.workload, b.workload),
		cmp.Compare(a.ordinal, b.ordinal),
	)
}

// node is a Node after normalisation, with its hash.
type node struct {
	name   string
	weight float64 // normalised: finite and > 0
	labels map[string]string
	alloc  Resources
	hash   uint64
}

// canonicalNodes drops unnamed nodes, normalises weights, sorts by name
// and keeps the first of each name by (weight, allocatable, labels).
func canonicalNodes(nodes []Node) []node {
	ns := make([]node, 0, len(nodes))
	for _, n := range nodes {
		if n.Name == "" {
			continue
		}
		w := n.Weight
		if !(w > 0) || math.IsInf(w, 1) {
			w = 1
		}
		ns = append(ns, node{name: n.Name, weight: w, labels: n.Labels, alloc: n.Allocatable})
	}
	slices.SortFunc(ns, func(a, b node) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c // the common case: skip the rest (cmp.Or evaluates all)
		}
		return cmp.Or(
			cmp.Compare(a.weight, b.weight),
			cmp.Compare(a.alloc.MilliCPU, b.alloc.MilliCPU),
			cmp.Compare(a.alloc.MemoryBytes, b.alloc.MemoryBytes),
			compareLabels(a.labels, b.labels),
		)
	})
	ns = slices.CompactFunc(ns, func(a, b node) bool { return a.name == b.name })
	for i := range ns {
		ns[i].hash = nodeHash(ns[i].name)
	}
	return ns
}

// canonicalWorkloads sorts workloads by key and keeps the first of each key
// by (replicas, requests, selector).
func canonicalWorkloads(workloads []Workload) []Workload {
	ws := slices.Clone(workloads)
	slices.SortFunc(ws, func(a, b Workload) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return cmp.Or(
			cmp.Compare(a.Replicas, b.Replicas),
			cmp.Compare(a.Requests.MilliCPU, b.Requests.MilliCPU),
			cmp.Compare(a.Requests.MemoryBytes, b.Requests.MemoryBytes),
			compareLabels(a.NodeSelector, b.NodeSelector),
			comparePins(a.Pinned, b.Pinned),
		)
	})
	return slices.CompactFunc(ws, func(a, b Workload) bool { return a.Key == b.Key })
}

// comparePins orders pin sets by their sorted (ordinal, node) pairs.
func comparePins(a, b map[int]string) int {
	ka, kb := slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b))
	for i := range min(len(ka), len(kb)) {
		if c := cmp.Or(cmp.Compare(ka[i], kb[i]), strings.Compare(a[ka[i]], b[kb[i]])); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(ka), len(kb))
}

// compareLabels orders label sets by their sorted (key, value) pairs.
func compareLabels(a, b map[string]string) int {
	if len(a) == 0 && len(b) == 0 {
		return 0
	}
	return slices.CompareFunc(sortedLabels(a), sortedLabels(b), func(x, y [2]string) int {
		return cmp.Or(strings.Compare(x[0], y[0]), strings.Compare(x[1], y[1]))
	})
}

func sortedLabels(m map[string]string) [][2]string {
	out := make([][2]string, 0, len(m))
	for k, v := range m {
		out = append(out, [2]string{k, v})
	}
	slices.SortFunc(out, func(x, y [2]string) int { return strings.Compare(x[0], y[0]) })
	return out
}

// bounds returns the load bound of each node: max(ceil(s), floor(c*s))
// with s = total*w/sum(w) its weighted share.
//
// Mirrokni et al. use ceil(c*s). With 10 replicas per node and c = 1.25
// that is 13, 1.3 times the mean; floor(c*s) = 12 keeps the busiest node
// within c of the mean whenever the share allows it, and ceil(s) keeps the
// bounds summing to at least total, so every replica still finds a node
// when nothing else rules nodes out. The result never exceeds ceil(c*s).
// The price of the tighter bound is churn: at 100 nodes and 1,000
// replicas a departing node moves 1.44 replicas per orphan on average
// with a bound of 12, 1.23 with 13.
func bounds(ns []node, total int, loadFactor float64) []int {
	c := loadFactor
	switch {
	case math.IsNaN(c) || c <= 0:
		c = DefaultLoadFactor
	case c < 1:
		c = 1
	}
	var sum float64
	for _, n := range ns {
		sum += n.weight
	}
	out := make([]int, len(ns))
	if total == 0 {
		return out
	}
	for i, n := range ns {
		share := float64(total) * n.weight / sum
		// The relative 1e-9 absorbs rounding in share so that an exact
		// integer share is not bumped by one; it cannot make the bounds
		// sum below total while total < 1e9. The float64 conversions stop
		// arm64 from fusing c*share+x into one FMA, whose different
		// rounding would give that architecture different bounds (see
		// portableLog).
		hi := math.Floor(float64(c*share) + float64(1e-9*share))
		lo := math.Ceil(share - float64(1e-9*share))
		b := math.Min(math.Max(lo, hi), float64(total)) // also tames c = +Inf
		out[i] = int(b)
	}
	return out
}

// unlimited marks a resource with no Allocatable limit.
const unlimited = math.MaxInt64

// assigner holds the per-node state of one Assign call, as parallel slices
// indexed like the canonical node list so the per-replica scan over all
// nodes touches little memory and allocates nothing.
type assigner struct {
	nodes   []node
	hash    []uint64
	bound   []int
	load    []int
	freeCPU []int64 // remaining MilliCPU, unlimited if no limit
	freeMem []int64 // remaining MemoryBytes, unlimited if no limit
	// held is the number of replicas of the workload being placed on each
	// node, filled in from workloadState around a scan and zero otherwise.
	held []int
	// Nodes of equal weight are compared by hash alone (score is
	// monotone in the hash for a fixed weight), so the scan keeps the
	// best node of each weight class and computes a logarithm only per
	// class, not per node.
	class       []int
	classWeight []float64
	classBest   []choice          // scratch for best, one per class
	classTop    []topList         // scratch for shortlist, one per class
	merge       []choice          // scratch for shortlist
	selectors   map[string][]bool // by selector key, see selector
	labelBuf    [][2]string       // scratch for selector
	keyBuf      []byte            // scratch for selector
	index       map[string]int    // node index by name, for pins (placePinned)
}

func newAssigner(ns []node, bound []int) *assigner {
	s := &assigner{
		nodes:     ns,
		hash:      make([]uint64, len(ns)),
		bound:     bound,
		load:      make([]int, len(ns)),
		freeCPU:   make([]int64, len(ns)),
		freeMem:   make([]int64, len(ns)),
		held:      make([]int, len(ns)),
		class:     make([]int, len(ns)),
		selectors: make(map[string][]bool),
	}
	classOf := make(map[float64]int)
	for i, n := range ns {
		s.hash[i] = n.hash
		s.freeCPU[i] = limit(n.alloc.MilliCPU)
		s.freeMem[i] = limit(n.alloc.MemoryBytes)
		c, ok := classOf[n.weight]
		if !ok {
			c = len(s.classWeight)
			classOf[n.weight] = c
			s.classWeight = append(s.classWeight, n.weight)
		}
		s.class[i] = c
	}
	s.classBest = make([]choice, len(s.classWeight))
	s.classTop = make([]topList, len(s.classWeight))
	return s
}

func limit(alloc int64) int64 {
	if alloc == 0 {
		return unlimited
	}
	return alloc
}

// selector returns which nodes carry every label of sel, nil meaning all.
// Results are cached per distinct selector, so workloads sharing one cost
// a map lookup.
func (s *assigner) selector(sel map[string]string) []bool {
	if len(sel) == 0 {
		return nil
	}
	s.labelBuf = s.labelBuf[:0]
	for k, v := range sel {
		s.labelBuf = append(s.labelBuf, [2]string{k, v})
	}
	slices.SortFunc(s.labelBuf, func(x, y [2]string) int { return strings.Compare(x[0], y[0]) })
	key := s.keyBuf[:0]
	for _, kv := range s.labelBuf {
		// Length prefixes keep the key unambiguous whatever the labels hold.
		for _, part := range kv {
			key = strconv.AppendInt(key, int64(len(part)), 10)
			key = append(key, ':')
			key = append(key, part...)
		}
	}
	s.keyBuf = key
	if m, ok := s.selectors[string(key)]; ok {
		return m
	}
	m := make([]bool, len(s.nodes))
	for i, n := range s.nodes {
		m[i] = matches(n.labels, sel)
	}
	s.selectors[string(key)] = m
	return m
}

func matches(labels, sel map[string]string) bool {
	for k, v := range sel {
		if lv, ok := labels[k]; !ok || lv != v {
			return false
		}
	}
	return true
}

// choice is the best node found by a scan, or idx -1 if none qualified.
type choice struct {
	idx   int
	held  int     // replicas of the workload on it
	h     uint64  // pairHash
	score float64 // score(weight, h); set where weights differ, and for a shortlist's first
}

// shortlistLen is how many of its best nodes (by selector alone) each
// replica remembers from the first scan. Most replicas take the first that
// can take them; only when all are ruled out does pick scan every node
// again: at 1,000 nodes, 10 replicas per node and c = 1.25 that is 15 of
// 10,000 replicas (31 on the mixed benchmark cluster).
const shortlistLen = 4

// shortlist scans the nodes matching sel and stores in out the first n of
// them in rankIndices order for the replica with hash rh; it returns the
// first as a choice, with its score, and n.
func (s *assigner) shortlist(rh uint64, sel []bool, out *[shortlistLen]int32) (choice, int) {
	all := s.merge[:0]
	if len(s.classWeight) == 1 {
		// Equal weights, the common case: rank by hash alone, in locals.
		var top topList
		for i, nh := range s.hash {
			if sel != nil && !sel[i] {
				continue
			}
			if h := pairHash(nh, rh); top.admits(h) {
				top.insert(i, h)
			}
		}
		// Only the first needs a score, for claimOrder.
		all = top.appendTo(all, s.classWeight[0], false)
	} else {
		for c := range s.classTop {
			s.classTop[c].n = 0
		}
		for i, nh := range s.hash {
			if sel != nil && !sel[i] {
				continue
			}
			top := &s.classTop[s.class[i]]
			if h := pairHash(nh, rh); top.admits(h) {
				top.insert(i, h)
			}
		}
		for c := range s.classTop {
			all = s.classTop[c].appendTo(all, s.classWeight[c], true)
		}
		slices.SortFunc(all, func(a, b choice) int {
			return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(b.h, a.h), cmp.Compare(a.idx, b.idx))
		})
	}
	s.merge = all
	n := min(len(all), shortlistLen)
	for k := range n {
		out[k] = int32(all[k].idx)
	}
	if n == 0 {
		return choice{idx: -1}, 0
	}
	return all[0], n
}

// topList is the best few nodes of one weight class in a scan, by hash
// descending; on equal hashes the earlier (smaller) node stays ahead.
type topList struct {
	h   [shortlistLen]uint64
	idx [shortlistLen]int32
	n   int
}

// admits reports whether a node with hash h enters the list.
func (t *topList) admits(h uint64) bool { return t.n < shortlistLen || h > t.h[shortlistLen-1] }

// insert adds node i with hash h; admits(h) must hold.
func (t *topList) insert(i int, h uint64) {
	if t.n < shortlistLen {
		t.n++
	}
	j := t.n - 1
	for ; j > 0 && t.h[j-1] < h; j-- {
		t.h[j], t.idx[j] = t.h[j-1], t.idx[j-1]
	}
	t.h[j], t.idx[j] = h, int32(i)
}

// appendTo appends the list's nodes as choices, scored with weight w.
func (t *topList) appendTo(all []choice, w float64, scoreAll bool) []choice {
	for k := range t.n {
		ch := choice{idx: int(t.idx[k]), h: t.h[k]}
		if scoreAll || k == 0 {
			ch.score = score(w, ch.h)
		}
		all = append(all, ch)
	}
	return all
}

// pick returns the node for r, or -1 if none can take it: the first node
// in r's rank order among those matching the selector, able to take the
// replica now and holding the fewest replicas of the workload.
func (s *assigner) pick(r replica, short []int32, st *workloadState) int {
	// The first shortlisted node that can take the replica and holds none
	// of the workload is the answer: every node ranked above it is on the
	// shortlist and was ruled out, and no node holds fewer than none.
	for _, i := range short {
		if s.fits(int(i), st.req) && !slices.Contains(st.holders, int(i)) {
			return int(i)
		}
	}
	for j, h := range st.holders {
		s.held[h] = st.counts[j]
	}
	i := s.best(r.hash, st.sel, st.req).idx
	for _, h := range st.holders {
		s.held[h] = 0
	}
	return i
}

// fits reports whether node i can take one more replica requesting req now.
func (s *assigner) fits(i int, req Resources) bool {
	return s.load[i] < s.bound[i] &&
		(req.MilliCPU == 0 || req.MilliCPU <= s.freeCPU[i]) &&
		(req.MemoryBytes == 0 || req.MemoryBytes <= s.freeMem[i])
}

// best returns the first node in rankIndices order for the replica with
// hash rh among those matching sel, able to take req now and holding the
// fewest replicas of the workload (s.held). It is the walk down the ranked
// list in one pass, without sorting.
func (s *assigner) best(rh uint64, sel []bool, req Resources) choice {
	for c := range s.classBest {
		s.classBest[c].idx = -1
	}
	for i, nh := range s.hash {
		if sel != nil && !sel[i] || !s.fits(i, req) {
			continue
		}
		h := pairHash(nh, rh)
		b := &s.classBest[s.class[i]]
		// i ascends, so on equal (held, h) the smaller name stays.
		if b.idx < 0 || s.held[i] < b.held || s.held[i] == b.held && h > b.h {
			*b = choice{idx: i, held: s.held[i], h: h}
		}
	}
	if len(s.classBest) == 1 {
		return s.classBest[0]
	}
	win := choice{idx: -1}
	for c, b := range s.classBest {
		if b.idx < 0 {
			continue
		}
		b.score = score(s.classWeight[c], b.h)
		if win.idx < 0 || cmp.Or(
			cmp.Compare(b.held, win.held),
			cmp.Compare(win.score, b.score),
			cmp.Compare(win.h, b.h),
			cmp.Compare(b.idx, win.idx),
		) < 0 {
			win = b
		}
	}
	return win
}

// take records one replica requesting req on node i.
func (s *assigner) take(i int, req Resources) {
	s.load[i]++
	if s.freeCPU[i] != unlimited {
		s.freeCPU[i] -= req.MilliCPU
	}
	if s.freeMem[i] != unlimited {
		s.freeMem[i] -= req.MemoryBytes
	}
}

// placePinned places the pinned ordinals of w (Workload.Pinned) before
// any other replica: on their node when it is among the nodes, matches
// the selector and has the requests left, whatever its load bound;
// otherwise Pending with a reason that names the node.
func (s *assigner) placePinned(w Workload, st *workloadState, owners []string, p Placement) {
	if len(w.Pinned) == 0 {
		return
	}
	if s.index == nil {
		s.index = make(map[string]int, len(s.nodes))
		for i, n := range s.nodes {
			s.index[n.name] = i
		}
	}
	for _, ord := range slices.Sorted(maps.Keys(w.Pinned)) {
		if ord < 0 || ord >= len(owners) {
			continue
		}
		name := w.Pinned[ord]
		i, ok := s.index[name]
		var why string
		switch {
		case !ok:
			why = fmt.Sprintf("its volume is on node %s, which is down, cut off or not ready: waiting for it", name)
		case st.sel != nil && !st.sel[i]:
			why = fmt.Sprintf("its volume is on node %s, which does not match the nodeSelector", name)
		case st.req.MilliCPU > 0 && st.req.MilliCPU > s.freeCPU[i] || st.req.MemoryBytes > 0 && st.req.MemoryBytes > s.freeMem[i]:
			why = fmt.Sprintf("its volume is on node %s, which has not the cpu or memory it requests left", name)
		}
		if why != "" {
			if p.Pending[w.Key] == nil {
				p.Pending[w.Key] = make(map[int]string)
			}
			p.Pending[w.Key][ord] = why
			continue
		}
		s.take(i, st.req)
		st.hold(i)
		owners[ord] = name
	}
}

// reason explains why no node can take a replica, counting nodes per cause.
func (s *assigner) reason(sel []bool, req Resources) string {
	n := len(s.nodes)
	if n == 0 {
		return "0/0 nodes are available: no nodes"
	}
	var noMatch, cpu, mem, full int
	for i := range s.nodes {
		if sel != nil && !sel[i] {
			noMatch++
			continue
		}
		if req.MilliCPU > 0 && req.MilliCPU > s.freeCPU[i] {
			cpu++
		}
		if req.MemoryBytes > 0 && req.MemoryBytes > s.freeMem[i] {
			mem++
		}
		if s.load[i] >= s.bound[i] {
			full++
		}
	}
	var parts []string
	for _, c := range []struct {
		n    int
		text string
	}{
		{noMatch, "node(s) didn't match nodeSelector"},
		{cpu, "insufficient cpu"},
		{mem, "insufficient memory"},
		{full, "node(s) at their load bound"},
	} {
		if c.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c.n, c.text))
		}
	}
	return fmt.Sprintf("0/%d nodes are available: %s", n, strings.Join(parts, ", "))
}
