package placement

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// heldBy lists every placed replica of p as held by its owner: what the
// nodes report once they run what p gave them.
func heldBy(p Placement) []Holder {
	var out []Holder
	for key, owners := range p.Owners {
		for ord, o := range owners {
			if o != "" {
				out = append(out, Holder{Key: key, Ordinal: ord, Node: o})
			}
		}
	}
	return out
}

func named(n int) []Node {
	var out []Node
	for i := range n {
		out = append(out, Node{Name: fmt.Sprintf("n%03d", i)})
	}
	return out
}

// moved counts the replicas whose owner differs between a and b.
func moved(a, b Placement) int {
	n := 0
	for key, owners := range b.Owners {
		for ord, o := range owners {
			if a.Owner(key, ord) != o {
				n++
			}
		}
	}
	return n
}

// A node that returns to a large cluster takes nothing back: the nodes
// that took its replicas are under their load bound and keep them. With
// rendezvous hashing alone it took its whole share back, and bounded
// loads moved more. (10 replicas a node in Deployments of 50 on 100
// nodes: a node that took one holds no other of its Deployment.)
func TestReturningNodeTakesNothingBackWhereTheOthersCanKeepIt(t *testing.T) {
	nodes := named(100)
	var ws []Workload
	for i := range 20 {
		ws = append(ws, Workload{Key: fmt.Sprintf("ns/w%d", i), Replicas: 50})
	}
	all := Assign(nodes, ws, Options{})
	gone := nodes[37].Name
	without := Assign(slices.Delete(slices.Clone(nodes), 37, 38), ws, Options{})
	back := Keep(all, nodes, ws, heldBy(without), Options{})
	if m := moved(without, back); m != 0 {
		t.Errorf("%d replicas move when %s returns, want 0", m, gone)
	}
	if n := loads(back)[gone]; n != 0 {
		t.Errorf("the returning node is given %d replicas, want 0", n)
	}
	t.Logf("replicas moved by the return: %d with Keep, %d by rendezvous hashing alone (the node's share: %d)",
		moved(without, back), moved(without, all), loads(all)[gone])
}

// Where the nodes left cannot keep what they took, the load bound moves
// replicas back: 3 nodes and 6 replicas, the 2 survivors hold 3 each,
// over their bound of 2 once the third is back, which gets 2 again.
// Keep is greedy: where placement swapped two replicas between the
// survivors, both at their bound, the swap happens too (no more moves
// than rendezvous hashing alone).
func TestReturningNodeTakesItsShareWhenTheOthersAreOverTheirBound(t *testing.T) {
	nodes := named(3)
	ws := []Workload{{Key: "default/spread", Replicas: 6}}
	without := Assign(nodes[:2], ws, Options{})
	back := Keep(Assign(nodes, ws, Options{}), nodes, ws, heldBy(without), Options{})
	if got := loads(back); got["n000"] != 2 || got["n001"] != 2 || got["n002"] != 2 {
		t.Fatalf("want 2 replicas per node, got %v", got)
	}
	if m, plain := moved(without, back), moved(without, Assign(nodes, ws, Options{})); m > plain || m < 2 {
		t.Errorf("%d replicas moved, want from the returning node's 2 to placement's %d", m, plain)
	}
}

// Two copies of a replica (a healed partition, a returning node that
// started its share on an old view): the older stays, whichever node p
// gives the replica.
func TestOldestCopyKeepsTheReplica(t *testing.T) {
	nodes := named(10)
	ws := []Workload{{Key: "ns/a", Replicas: 3}}
	p := Assign(nodes, ws, Options{})
	owner := p.Owner("ns/a", 0)
	other := "n009"
	if other == owner {
		other = "n008"
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name                 string
		ownerAt, otherAt     time.Time
		ownerRuns, otherRuns bool
		want                 string
	}{
		{"the owner's copy is older", t0, t0.Add(time.Minute), true, true, owner},
		{"the other copy is older", t0.Add(time.Minute), t0, true, true, other},
		{"ages unknown: the owner's", time.Time{}, time.Time{}, true, true, owner},
		{"the owner's age unknown", time.Time{}, t0, true, true, other},
		{"the owner's older copy exited, the other runs", t0, t0.Add(time.Minute), false, true, other},
		{"neither runs: the older", t0.Add(time.Minute), t0, false, false, other},
	} {
		got := Keep(p, nodes, ws, []Holder{{Key: "ns/a", Node: other, Since: c.otherAt, Running: c.otherRuns},
			{Key: "ns/a", Node: owner, Since: c.ownerAt, Running: c.ownerRuns}}, Options{})
		if got.Owner("ns/a", 0) != c.want {
			t.Errorf("%s: want ordinal 0 at %s, got %s", c.name, c.want, got.Owner("ns/a", 0))
		}
	}
	// Held by the other alone, it stays there; p is not modified.
	got := Keep(p, nodes, ws, []Holder{{Key: "ns/a", Node: other}}, Options{})
	if got.Owner("ns/a", 0) != other || p.Owner("ns/a", 0) != owner {
		t.Fatalf("held by %s alone: want it kept there and p unchanged, got %s (p: %s)", other, got.Owner("ns/a", 0), p.Owner("ns/a", 0))
	}
}

// Kept replicas respect selectors, resources and spread.
func TestKeepRespectsSelectorResourcesAndSpread(t *testing.T) {
	nodes := []Node{
		{Name: "a", Labels: map[string]string{"disk": "ssd"}},
		{Name: "b", Labels: map[string]string{"disk": "ssd"}, Allocatable: Resources{MilliCPU: 500}},
		{Name: "c"},
		{Name: "d", Labels: map[string]string{"disk": "ssd"}},
	}
	ws := []Workload{
		{Key: "ns/ssd", Replicas: 1, NodeSelector: map[string]string{"disk": "ssd"}},
		{Key: "ns/big", Replicas: 1, Requests: Resources{MilliCPU: 1000}},
		{Key: "ns/two", Replicas: 2},
	}
	p := Assign(nodes, ws, Options{LoadFactor: 100})
	got := Keep(p, nodes, ws, []Holder{
		{Key: "ns/ssd", Node: "c"},                  // no label
		{Key: "ns/big", Node: "b"},                  // 500m, wants 1000m
		{Key: "ns/two", Node: p.Owner("ns/two", 1)}, // already holds the other replica: 2 on 4 nodes spread 1 a node
	}, Options{LoadFactor: 100})
	if !reflect.DeepEqual(got.Owners, p.Owners) {
		t.Fatalf("holders that fail a test must keep nothing: %v, want %v", got.Owners, p.Owners)
	}
	h := map[string]string{"a": "d", "b": "a", "d": "a"}[p.Owner("ns/ssd", 0)] // another ssd node, with room
	if got := Keep(p, nodes, ws, []Holder{{Key: "ns/ssd", Node: h}}, Options{LoadFactor: 100}); got.Owner("ns/ssd", 0) != h {
		t.Fatalf("ssd holder %s passes every test: want it kept there, got %s", h, got.Owner("ns/ssd", 0))
	}
}

// A replica placement left Pending stays where it runs.
func TestKeepPlacesAPendingReplicaWhereItRuns(t *testing.T) {
	nodes := []Node{{Name: "a", Allocatable: Resources{MilliCPU: 1000}}, {Name: "b", Allocatable: Resources{MilliCPU: 1000}}}
	ws := []Workload{{Key: "ns/x", Replicas: 3, Requests: Resources{MilliCPU: 600}}}
	p := Assign(nodes, ws, Options{})
	if len(p.Pending["ns/x"]) != 1 {
		t.Fatalf("want one of 3 pending: %v", p.Pending)
	}
	var ord int
	for o := range p.Pending["ns/x"] {
		ord = o
	}
	got := Keep(p, []Node{{Name: "a", Allocatable: Resources{MilliCPU: 1000}}, {Name: "b", Allocatable: Resources{MilliCPU: 1000}}, {Name: "c"}},
		ws, []Holder{{Key: "ns/x", Ordinal: ord, Node: "c"}}, Options{})
	if got.Owner("ns/x", ord) != "c" || len(got.Pending) != 0 || len(p.Pending["ns/x"]) != 1 {
		t.Fatalf("pending ordinal %d held by c: owner %q, pending %v (p's %v)", ord, got.Owner("ns/x", ord), got.Pending, p.Pending)
	}
}

// Properties over random inputs: only replicas with a holder move, each
// to one of its holders that matches the selector; no node that gains a
// replica goes over its bound; the result does not depend on the order
// of the inputs; p is not modified.
func TestKeepProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes, ws, opts := genInput(t)
		p := Assign(nodes, ws, opts)
		before := clonePlacement(p)
		names := []string{"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "zz"}
		keys := []string{"ns/a", "ns/b", "ns/c", "ns/d", "ns/e", "ns/f", "ns/g", "other/a", "none/x"}
		holders := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) Holder {
			return Holder{Key: rapid.SampledFrom(keys).Draw(t, "key"), Ordinal: rapid.IntRange(-1, 9).Draw(t, "ord"), Node: rapid.SampledFrom(names).Draw(t, "node"),
				Since: rapid.SampledFrom([]time.Time{{}, time.Unix(1, 0), time.Unix(2, 0), time.Unix(3, 0)}).Draw(t, "since"), Running: rapid.Bool().Draw(t, "running")}
		}), 0, 20).Draw(t, "holders")
		got := Keep(p, nodes, ws, holders, opts)
		if !reflect.DeepEqual(p, before) {
			t.Fatal("Keep modified p")
		}
		again := Keep(p, shuffled(t, nodes, "n"), shuffled(t, ws, "w"), shuffled(t, holders, "h"), opts)
		if !reflect.DeepEqual(got, again) {
			t.Fatalf("order changes the result:\n%v\n%v", got.Owners, again.Owners)
		}
		ns := canonicalNodes(nodes)
		bound := map[string]int{}
		total := 0
		for _, w := range canonicalWorkloads(ws) {
			total += max(w.Replicas, 0)
		}
		for i, b := range bounds(ns, total, opts.LoadFactor) {
			bound[ns[i].name] = b
		}
		labels := map[string]map[string]string{}
		for _, n := range ns {
			labels[n.name] = n.labels
		}
		sel := map[string]map[string]string{}
		for _, w := range canonicalWorkloads(ws) {
			sel[w.Key] = w.NodeSelector
		}
		before0, after := loads(p), loads(got)
		for key, owners := range got.Owners {
			for ord, o := range owners {
				if o == p.Owner(key, ord) {
					continue
				}
				if !slices.ContainsFunc(holders, func(h Holder) bool { return h.Key == key && h.Ordinal == ord && h.Node == o }) {
					t.Fatalf("%s/%d moved from %q to %q, which does not hold it", key, ord, p.Owner(key, ord), o)
				}
				if !matches(labels[o], sel[key]) {
					t.Fatalf("%s/%d kept on %s, which does not match its selector", key, ord, o)
				}
				if after[o] > before0[o] && after[o] > bound[o] {
					t.Fatalf("%s holds %d, over its bound %d", o, after[o], bound[o])
				}
			}
		}
	})
}

func clonePlacement(p Placement) Placement {
	out := Placement{Owners: map[string][]string{}, Pending: map[string]map[int]string{}}
	for k, v := range p.Owners {
		out.Owners[k] = slices.Clone(v)
	}
	for k, v := range p.Pending {
		m := map[int]string{}
		for o, r := range v {
			m[o] = r
		}
		out.Pending[k] = m
	}
	return out
}
