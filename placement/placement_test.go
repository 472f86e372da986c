package placement

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"
)

// names returns n nodes n0, n1, ...
func names(n int) []Node { return nodesNamed("n%d", n) }

// nodesNamed returns n unlabelled, unlimited nodes of weight 1, node i
// named fmt.Sprintf(format, i).
func nodesNamed(format string, n int) []Node {
	ns := make([]Node, n)
	for i := range ns {
		ns[i] = Node{Name: fmt.Sprintf(format, i)}
	}
	return ns
}

// countOwners returns how many ordinals of key each node owns.
func countOwners(p Placement, key string) map[string]int {
	out := map[string]int{}
	for _, o := range p.Owners[key] {
		out[o]++
	}
	return out
}

func TestAssignSpreadsReplicasEvenly(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodes    int
		replicas int
		want     []int // replicas per node, sorted descending
	}{
		{"fewer replicas than nodes", 5, 3, []int{1, 1, 1}},
		{"as many replicas as nodes", 4, 4, []int{1, 1, 1, 1}},
		{"more replicas than nodes", 3, 7, []int{3, 2, 2}},
		{"twice as many", 3, 6, []int{2, 2, 2}},
		{"one node", 1, 4, []int{4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Assign(names(tc.nodes), []Workload{{Key: "ns/web", Replicas: tc.replicas}}, Options{})
			var got []int
			for o, n := range countOwners(p, "ns/web") {
				if o == "" {
					t.Fatalf("unplaced replicas: %v", p.Pending)
				}
				got = append(got, n)
			}
			slices.Sort(got)
			slices.Reverse(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("replicas per node = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAssignSpreadsWhenWorkloadsCompete(t *testing.T) {
	// Three workloads of three replicas on three nodes: every node gets one
	// replica of each, whatever the hashes prefer.
	ws := []Workload{{Key: "ns/a", Replicas: 3}, {Key: "ns/b", Replicas: 3}, {Key: "ns/c", Replicas: 3}}
	p := Assign(names(3), ws, Options{})
	for _, w := range ws {
		if c := countOwners(p, w.Key); len(c) != 3 {
			t.Errorf("%s spread as %v, want one per node", w.Key, c)
		}
	}
}

func TestAssignNeverOvercommits(t *testing.T) {
	nodes := []Node{
		{Name: "small", Allocatable: Resources{MilliCPU: 1000, MemoryBytes: 1 << 30}},
		{Name: "big", Allocatable: Resources{MilliCPU: 4000, MemoryBytes: 8 << 30}},
	}
	ws := []Workload{{Key: "ns/db", Replicas: 6, Requests: Resources{MilliCPU: 900, MemoryBytes: 512 << 20}}}
	p := Assign(nodes, ws, Options{LoadFactor: math.Inf(1)})
	got := countOwners(p, "ns/db")
	// small fits 1 (900 of 1000 mCPU), big fits 4 (3600 of 4000): one pending.
	if got["small"] != 1 || got["big"] != 4 || got[""] != 1 {
		t.Errorf("replicas per node = %v, want small 1, big 4, unplaced 1", got)
	}
	want := "0/2 nodes are available: 2 insufficient cpu"
	for ord, reason := range p.Pending["ns/db"] {
		if reason != want {
			t.Errorf("pending %d: %q, want %q", ord, reason, want)
		}
	}
}

func TestAssignHonoursNodeSelector(t *testing.T) {
	nodes := []Node{
		{Name: "a1", Labels: map[string]string{"zone": "a", "disk": "ssd"}},
		{Name: "a2", Labels: map[string]string{"zone": "a"}},
		{Name: "b1", Labels: map[string]string{"zone": "b", "disk": "ssd"}},
		{Name: "b2"},
	}
	for _, tc := range []struct {
		selector map[string]string
		want     []string // owners, sorted
	}{
		{map[string]string{"zone": "a"}, []string{"a1", "a2"}},
		{map[string]string{"disk": "ssd"}, []string{"a1", "b1"}},
		// One node matches: both replicas share it rather than pend.
		{map[string]string{"zone": "a", "disk": "ssd"}, []string{"a1", "a1"}},
	} {
		t.Run(fmt.Sprint(tc.selector), func(t *testing.T) {
			p := Assign(nodes, []Workload{{Key: "ns/x", Replicas: 2, NodeSelector: tc.selector}}, Options{LoadFactor: math.Inf(1)})
			got := slices.Sorted(slices.Values(p.Owners["ns/x"]))
			if !slices.Equal(got, tc.want) {
				t.Errorf("owners = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAssignPendingReasons(t *testing.T) {
	zoneA, zoneB := map[string]string{"zone": "a"}, map[string]string{"zone": "b"}
	for _, tc := range []struct {
		name        string
		nodes       []Node
		w           []Workload
		wantPending int    // replicas of ns/x left unplaced
		wantReason  string // for each of them
	}{
		{
			name:        "no nodes",
			w:           []Workload{{Key: "ns/x", Replicas: 1}},
			wantPending: 1,
			wantReason:  "0/0 nodes are available: no nodes",
		},
		{
			name:        "no node matches",
			nodes:       names(3),
			w:           []Workload{{Key: "ns/x", Replicas: 2, NodeSelector: zoneA}},
			wantPending: 2,
			wantReason:  "0/3 nodes are available: 3 node(s) didn't match nodeSelector",
		},
		{
			name: "selector and cpu",
			nodes: []Node{
				{Name: "b1"}, {Name: "b2"},
				{Name: "a1", Labels: zoneA, Allocatable: Resources{MilliCPU: 500}},
				{Name: "a2", Labels: zoneA, Allocatable: Resources{MilliCPU: 500}},
				{Name: "a3", Labels: zoneA, Allocatable: Resources{MilliCPU: 500}},
			},
			w:           []Workload{{Key: "ns/x", Replicas: 1, NodeSelector: zoneA, Requests: Resources{MilliCPU: 1000}}},
			wantPending: 1,
			wantReason:  "0/5 nodes are available: 2 node(s) didn't match nodeSelector, 3 insufficient cpu",
		},
		{
			name: "cpu and memory on one node",
			nodes: []Node{
				{Name: "n1", Allocatable: Resources{MilliCPU: 100, MemoryBytes: 1 << 20}},
				{Name: "n2", Allocatable: Resources{MemoryBytes: 1 << 20}},
			},
			w:           []Workload{{Key: "ns/x", Replicas: 1, Requests: Resources{MilliCPU: 200, MemoryBytes: 1 << 30}}},
			wantPending: 1,
			wantReason:  "0/2 nodes are available: 1 insufficient cpu, 2 insufficient memory",
		},
		{
			name:  "negative allocatable admits only zero requests",
			nodes: []Node{{Name: "n1", Allocatable: Resources{MilliCPU: -1}}},
			w: []Workload{
				{Key: "ns/x", Replicas: 1, Requests: Resources{MilliCPU: 1}},
				{Key: "ns/y", Replicas: 1},
			},
			wantPending: 1,
			wantReason:  "0/1 nodes are available: 1 insufficient cpu",
		},
		{
			// 8 replicas on 2 nodes: each node's bound is max(ceil(4),
			// floor(1.25*4)) = 5, so the one node ns/x may use takes 5 of
			// its 6 replicas although it has room for more.
			name:  "load bound",
			nodes: []Node{{Name: "a", Labels: zoneA}, {Name: "b", Labels: zoneB}},
			w: []Workload{
				{Key: "ns/x", Replicas: 6, NodeSelector: zoneA},
				{Key: "ns/y", Replicas: 2, NodeSelector: zoneB},
			},
			wantPending: 1,
			wantReason:  "0/2 nodes are available: 1 node(s) didn't match nodeSelector, 1 node(s) at their load bound",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Assign(tc.nodes, tc.w, Options{})
			if got := len(p.Pending["ns/x"]); got != tc.wantPending {
				t.Errorf("%d replicas pending, want %d: %v", got, tc.wantPending, p.Pending)
			}
			for ord, reason := range p.Pending["ns/x"] {
				if reason != tc.wantReason {
					t.Errorf("ordinal %d: reason %q, want %q", ord, reason, tc.wantReason)
				}
				if o := p.Owner("ns/x", ord); o != "" {
					t.Errorf("pending ordinal %d has owner %q", ord, o)
				}
			}
			for k, m := range p.Pending {
				if k != "ns/x" && len(m) > 0 {
					t.Errorf("unexpected pending %s: %v", k, m)
				}
			}
		})
	}
}

func TestAssignFollowsWeights(t *testing.T) {
	nodes := []Node{{Name: "light", Weight: 1}, {Name: "default"}, {Name: "heavy", Weight: 3}}
	ws := uniformWorkloads(500, 1) // single replicas: no spread effects
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"bounded", Options{}},
		{"plain rendezvous", Options{LoadFactor: math.Inf(1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := loads(Assign(nodes, ws, tc.opts))
			// Shares 1:1:3 of 500 are 100, 100, 300.
			for name, want := range map[string]float64{"light": 100, "default": 100, "heavy": 300} {
				if got := float64(l[name]); math.Abs(got-want) > 0.2*want {
					t.Errorf("%s holds %v, want %v ± 20%%", name, got, want)
				}
			}
			t.Logf("loads %v", l)
		})
	}
}

func TestRankFirstChoiceFollowsWeights(t *testing.T) {
	// P(node ranks first) = w / sum(w) (Schindelhauer and Schomaker 2005).
	nodes := []Node{{Name: "a", Weight: 1}, {Name: "b", Weight: 2}, {Name: "c", Weight: 5}}
	const keys = 20000
	first := map[string]int{}
	for i := range keys {
		first[Rank(nodes, fmt.Sprintf("ns/k%d", i), 0)[0]]++
	}
	for name, w := range map[string]float64{"a": 1, "b": 2, "c": 5} {
		want := keys * w / 8
		// 5 standard deviations of a binomial count.
		if got := float64(first[name]); math.Abs(got-want) > 5*math.Sqrt(want*(1-w/8)) {
			t.Errorf("%s first for %v of %d keys, want about %v", name, got, keys, want)
		}
	}
}

func TestRankIsAssignOrder(t *testing.T) {
	nodes := names(8)
	for i := range 50 {
		key := fmt.Sprintf("ns/w%d", i)
		r := Rank(nodes, key, 0)
		if len(r) != 8 {
			t.Fatalf("Rank returned %d nodes, want 8", len(r))
		}
		if got := Assign(nodes, []Workload{{Key: key, Replicas: 1}}, Options{}).Owner(key, 0); got != r[0] {
			t.Errorf("%s: owner %s, Rank first %s", key, got, r[0])
		}
		// With the first choice full (cpu), the replica goes to the second.
		full := slices.Clone(nodes)
		for j := range full {
			if full[j].Name == r[0] {
				full[j].Allocatable.MilliCPU = 1
			}
		}
		w := []Workload{{Key: key, Replicas: 1, Requests: Resources{MilliCPU: 2}}}
		if got := Assign(full, w, Options{}).Owner(key, 0); got != r[1] {
			t.Errorf("%s: with %s full, owner %s, want Rank second %s", key, r[0], got, r[1])
		}
	}
}

func TestAssignZeroOrNegativeReplicas(t *testing.T) {
	p := Assign(names(3), []Workload{{Key: "ns/zero"}, {Key: "ns/neg", Replicas: -2}}, Options{})
	for _, key := range []string{"ns/zero", "ns/neg"} {
		if o, ok := p.Owners[key]; !ok || o == nil || len(o) != 0 {
			t.Errorf("Owners[%s] = %#v, present %v, want empty non-nil slice", key, o, ok)
		}
	}
	if len(p.Pending) != 0 {
		t.Errorf("pending = %v", p.Pending)
	}
}

func TestAssignDuplicatesKeepFirstInSortedOrder(t *testing.T) {
	// Duplicate node names: the lower weight sorts first and is kept, in
	// either input order. Duplicate keys: the fewer replicas are kept.
	a := []Node{{Name: "n1", Weight: 2}, {Name: "n1", Weight: 1}, {Name: "n2"}, {Name: ""}}
	b := []Node{{Name: "n2"}, {Name: "n1", Weight: 1}, {Name: ""}, {Name: "n1", Weight: 2}}
	ws := []Workload{{Key: "ns/x", Replicas: 5}, {Key: "ns/x", Replicas: 2}}
	pa := Assign(a, ws, Options{})
	rev := slices.Clone(ws)
	slices.Reverse(rev)
	pb := Assign(b, rev, Options{})
	if !reflect.DeepEqual(pa, pb) {
		t.Fatalf("results differ with input order:\n%v\n%v", pa, pb)
	}
	if got := len(pa.Owners["ns/x"]); got != 2 {
		t.Errorf("kept workload has %d replicas, want 2", got)
	}
	if got := canonicalNodes(a); len(got) != 2 || got[0].weight != 1 {
		t.Errorf("canonical nodes = %+v, want n1 (weight 1) and n2", got)
	}
	if r := Rank(a, "ns/x", 0); len(r) != 2 {
		t.Errorf("Rank = %v, want 2 distinct named nodes", r)
	}
}

func TestPlacementOwnerAndOwnedBy(t *testing.T) {
	p := Placement{Owners: map[string][]string{
		"ns/b": {"n1", "n2", "n1"},
		"ns/a": {"n2", "", "n1"},
	}}
	for _, tc := range []struct {
		key  string
		ord  int
		want string
	}{
		{"ns/b", 2, "n1"}, {"ns/a", 1, ""}, {"ns/a", 3, ""}, {"ns/a", -1, ""}, {"ns/none", 0, ""},
	} {
		if got := p.Owner(tc.key, tc.ord); got != tc.want {
			t.Errorf("Owner(%s, %d) = %q, want %q", tc.key, tc.ord, got, tc.want)
		}
	}
	want := []Slot{{"ns/a", 2}, {"ns/b", 0}, {"ns/b", 2}}
	if got := p.OwnedBy("n1"); !slices.Equal(got, want) {
		t.Errorf("OwnedBy(n1) = %v, want %v", got, want)
	}
	if got := p.OwnedBy(""); len(got) != 0 {
		t.Errorf("OwnedBy(\"\") = %v, want none", got)
	}
}

func TestLoadFactorOptions(t *testing.T) {
	ns := canonicalNodes(names(100))
	for _, tc := range []struct {
		c    float64
		want int // bound at a share of 10 replicas per node
	}{
		{0, 12}, {math.NaN(), 12}, {-1, 12}, {1.25, 12}, {1.3, 13}, {1, 10}, {0.5, 10}, {math.Inf(1), 1000},
	} {
		if got := bounds(ns, 1000, tc.c)[0]; got != tc.want {
			t.Errorf("LoadFactor %v: bound %d, want %d", tc.c, got, tc.want)
		}
	}
	// A share of 2.4 (12 replicas on 5 nodes): floor(1.25*2.4) = 3 = ceil(2.4).
	if got := bounds(canonicalNodes(names(5)), 12, 0)[0]; got != 3 {
		t.Errorf("small share: bound %d, want 3", got)
	}
}

func TestPortableLogMatchesMathLog(t *testing.T) {
	ulp := func(x float64) float64 { return math.Nextafter(x, math.Inf(1)) - x }
	h := uint64(1)
	for range 200000 {
		h = mix(h + golden)
		k := h >> 16
		u := (float64(k) + 0.5) * 0x1p-48
		got, want := portableLog(u), math.Log(u)
		if math.Abs(got-want) > ulp(math.Abs(want)) {
			t.Fatalf("portableLog(%v) = %v, math.Log %v", u, got, want)
		}
		// Monotone on the 48-bit grid that score uses.
		next := portableLog((float64(k+1) + 0.5) * 0x1p-48)
		if k+1 < 1<<48 && !(next > got) {
			t.Fatalf("portableLog not increasing at k=%d: %v then %v", k, got, next)
		}
	}
	for _, u := range []float64{0.5 * 0x1p-48, 1 - 0.5*0x1p-48, 0.5, math.Sqrt2 / 2} {
		if got, want := portableLog(u), math.Log(u); math.Abs(got-want) > ulp(math.Abs(want)) {
			t.Errorf("portableLog(%v) = %v, math.Log %v", u, got, want)
		}
	}
}

// TestHashGoldenValues pins the hash and score bit for bit: every node of
// every release must compute the same ranks, and a change here moves
// replicas cluster-wide on upgrade, so it must be deliberate.
func TestHashGoldenValues(t *testing.T) {
	if got := fnv1a("a"); got != 0xaf63dc4c8601ec8c { // FNV-1a test vector
		t.Errorf("fnv1a(a) = %#x", got)
	}
	nh, rh := nodeHash("n0"), replicaHash("default/web", 0)
	if nh != 0xa362912333025e6 || rh != 0x5fb74f9268a03ccf || pairHash(nh, rh) != 0xa07193563f783ffb {
		t.Errorf("hashes %#x %#x %#x", nh, rh, pairHash(nh, rh))
	}
	if got := math.Float64bits(score(2, pairHash(nh, rh))); got != 0x40111f3c9dc9c4de {
		t.Errorf("score bits %#x", got)
	}
	if got, want := Rank(names(5), "default/web", 0), []string{"n4", "n3", "n2", "n0", "n1"}; !slices.Equal(got, want) {
		t.Errorf("Rank = %v, want %v", got, want)
	}
	weighted := []Node{{Name: "a", Weight: 1}, {Name: "b", Weight: 2}, {Name: "c", Weight: 3}}
	if got, want := Rank(weighted, "default/web", 1), []string{"b", "c", "a"}; !slices.Equal(got, want) {
		t.Errorf("weighted Rank = %v, want %v", got, want)
	}
}

func TestAssignPlacesSelectorReplicasFirst(t *testing.T) {
	// Half the nodes are in zone a and a quarter of the workloads must run
	// there, so zone a's nodes are in demand; were replicas free to go
	// anywhere placed first, they would take slots on zone a's nodes up to
	// the load bound and leave pinned replicas pending.
	nodes, ws := mixedCluster(1000, 1000, 10)
	p := Assign(nodes, ws, Options{})
	if n := len(pendingSlots(p)); n > 0 {
		t.Errorf("%d replicas pending, e.g. %v", n, p.Pending)
	}
}
