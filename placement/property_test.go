package placement

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// Generators draw from small name and label pools so that duplicates,
// selector hits and misses, full nodes and pending replicas all happen.

func genNode(t *rapid.T, label string) Node {
	labels := map[string]string{}
	if z := rapid.SampledFrom([]string{"", "a", "b"}).Draw(t, label+"zone"); z != "" {
		labels["zone"] = z
	}
	if rapid.Bool().Draw(t, label+"ssd") {
		labels["disk"] = "ssd"
	}
	return Node{
		Name:   rapid.SampledFrom([]string{"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", ""}).Draw(t, label+"name"),
		Weight: rapid.SampledFrom([]float64{0, 1, 1, 1, 2, 0.5, 3, -1, math.NaN(), math.Inf(1)}).Draw(t, label+"weight"),
		Labels: labels,
		Allocatable: Resources{
			MilliCPU:    rapid.SampledFrom([]int64{0, 0, 500, 1000, 2000, -1}).Draw(t, label+"cpu"),
			MemoryBytes: rapid.SampledFrom([]int64{0, 0, 1 << 30, 4 << 30, -1}).Draw(t, label+"mem"),
		},
	}
}

func genWorkload(t *rapid.T, label string) Workload {
	sel := rapid.SampledFrom([]map[string]string{nil, nil, {"zone": "a"}, {"disk": "ssd"}, {"zone": "b", "disk": "ssd"}}).Draw(t, label+"sel")
	return Workload{
		Key:      rapid.SampledFrom([]string{"ns/a", "ns/b", "ns/c", "ns/d", "ns/e", "ns/f", "ns/g", "other/a"}).Draw(t, label+"key"),
		Replicas: rapid.IntRange(-1, 9).Draw(t, label+"replicas"),
		Requests: Resources{
			MilliCPU:    rapid.SampledFrom([]int64{0, 100, 300, 700, -5}).Draw(t, label+"cpu"),
			MemoryBytes: rapid.SampledFrom([]int64{0, 256 << 20, 1 << 30}).Draw(t, label+"mem"),
		},
		NodeSelector: sel,
	}
}

func genInput(t *rapid.T) ([]Node, []Workload, Options) {
	nodes := rapid.Custom(func(t *rapid.T) Node { return genNode(t, "") })
	wls := rapid.Custom(func(t *rapid.T) Workload { return genWorkload(t, "") })
	return rapid.SliceOfN(nodes, 0, 10).Draw(t, "nodes"),
		rapid.SliceOfN(wls, 0, 8).Draw(t, "workloads"),
		Options{LoadFactor: rapid.SampledFrom([]float64{0, 0, 1, 1.1, 1.25, 2, 0.5, math.Inf(1), math.NaN()}).Draw(t, "loadFactor")}
}

func shuffled[T any](t *rapid.T, s []T, label string) []T {
	out := slices.Clone(s)
	for i := len(out) - 1; i > 0; i-- {
		j := rapid.IntRange(0, i).Draw(t, fmt.Sprintf("%s%d", label, i))
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func TestPropertyAssignIgnoresInputOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes, ws, opts := genInput(t)
		want := Assign(nodes, ws, opts)
		got := Assign(shuffled(t, nodes, "n"), shuffled(t, ws, "w"), opts)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("shuffled input changed the result:\n got %v\nwant %v", got, want)
		}
	})
}

func TestPropertyRankIgnoresInputOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes, _, _ := genInput(t)
		key := rapid.SampledFrom([]string{"ns/a", "ns/b", ""}).Draw(t, "key")
		ord := rapid.IntRange(0, 5).Draw(t, "ord")
		want := Rank(nodes, key, ord)
		if got := Rank(shuffled(t, nodes, "n"), key, ord); !slices.Equal(got, want) {
			t.Fatalf("Rank(shuffled) = %v, want %v", got, want)
		}
	})
}

func TestPropertyAssignMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes, ws, opts := genInput(t)
		got, want := Assign(nodes, ws, opts), assignReference(nodes, ws, opts)
		if !reflect.DeepEqual(got.Owners, want.Owners) {
			t.Fatalf("owners differ from the reference:\n got %v\nwant %v", got.Owners, want.Owners)
		}
		if !reflect.DeepEqual(pendingSlots(got), pendingSlots(want)) {
			t.Fatalf("pending differs from the reference:\n got %v\nwant %v", got.Pending, want.Pending)
		}
	})
}

func pendingSlots(p Placement) []Slot {
	var out []Slot
	for k, m := range p.Pending {
		for o := range m {
			out = append(out, Slot{k, o})
		}
	}
	slices.SortFunc(out, func(a, b Slot) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return a.Ordinal - b.Ordinal
	})
	return out
}

// TestPropertyAssignInvariants checks the rules on the result alone:
// selectors honoured, no overcommit, load bound, spread, pending only
// when nothing can take the replica, and the reason present.
func TestPropertyAssignInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes, ws, opts := genInput(t)
		p := Assign(nodes, ws, opts)
		ns := canonicalNodes(nodes)
		kept := canonicalWorkloads(ws)
		byName := map[string]node{}
		var sumW float64
		for _, n := range ns {
			byName[n.name] = n
			sumW += n.weight
		}
		total := 0
		for _, w := range kept {
			total += max(w.Replicas, 0)
		}

		load := map[string]int{}
		usedCPU, usedMem := map[string]int64{}, map[string]int64{}
		for _, w := range kept {
			owners := p.Owners[w.Key]
			if len(owners) != max(w.Replicas, 0) || owners == nil {
				t.Fatalf("%s: %d owners for %d replicas (nil %v)", w.Key, len(owners), w.Replicas, owners == nil)
			}
			for ord, o := range owners {
				reason, pending := p.Pending[w.Key][ord]
				if (o == "") != pending {
					t.Fatalf("%s/%d: owner %q but pending %v", w.Key, ord, o, pending)
				}
				if pending {
					if !strings.HasPrefix(reason, fmt.Sprintf("0/%d nodes are available: ", len(ns))) {
						t.Fatalf("%s/%d: reason %q", w.Key, ord, reason)
					}
					continue
				}
				n, ok := byName[o]
				if !ok {
					t.Fatalf("%s/%d: owner %q is not a node", w.Key, ord, o)
				}
				if !matches(n.labels, w.NodeSelector) {
					t.Fatalf("%s/%d on %s: labels %v do not match %v", w.Key, ord, o, n.labels, w.NodeSelector)
				}
				load[o]++
				usedCPU[o] += max(w.Requests.MilliCPU, 0)
				usedMem[o] += max(w.Requests.MemoryBytes, 0)
			}
		}
		if len(p.Owners) != len(kept) {
			t.Fatalf("%d owner entries for %d workloads", len(p.Owners), len(kept))
		}

		c := opts.LoadFactor
		if math.IsNaN(c) || c <= 0 {
			c = DefaultLoadFactor
		}
		c = max(c, 1) // documented: values below 1 act as 1
		for _, n := range ns {
			if over(n.alloc.MilliCPU, usedCPU[n.name]) || over(n.alloc.MemoryBytes, usedMem[n.name]) {
				t.Fatalf("%s overcommitted: used %d mCPU %d B of %+v", n.name, usedCPU[n.name], usedMem[n.name], n.alloc)
			}
			// The bound the brief states, ceil(c * total * w / sum(w)).
			if b := math.Ceil(c * float64(total) * n.weight / sumW); float64(load[n.name]) > b {
				t.Fatalf("%s holds %d replicas, bound %v", n.name, load[n.name], b)
			}
		}

		bound := bounds(ns, total, opts.LoadFactor)
		canTake := func(i int, w Workload) bool {
			n := ns[i]
			return matches(n.labels, w.NodeSelector) &&
				load[n.name] < bound[i] &&
				!over(n.alloc.MilliCPU, usedCPU[n.name]+max(w.Requests.MilliCPU, 0)) &&
				!over(n.alloc.MemoryBytes, usedMem[n.name]+max(w.Requests.MemoryBytes, 0))
		}
		for _, w := range kept {
			held := map[string]int{}
			maxHeld := 0
			for _, o := range p.Owners[w.Key] {
				if o != "" {
					held[o]++
					maxHeld = max(maxHeld, held[o])
				}
			}
			for i, n := range ns {
				if !canTake(i, w) {
					continue
				}
				// A node that could still take a replica holds at least
				// maxHeld-1 of them: nobody got a second while it had none.
				if held[n.name] < maxHeld-1 {
					t.Fatalf("%s: %s holds %d, another node %d, and %s could take more", w.Key, n.name, held[n.name], maxHeld, n.name)
				}
				// Pending only when nothing can take it.
				if len(p.Pending[w.Key]) > 0 {
					t.Fatalf("%s: replicas pending %v but %s could take one", w.Key, p.Pending[w.Key], n.name)
				}
			}
		}
	})
}

// over reports whether used exceeds alloc, where 0 means unlimited and a
// negative alloc admits nothing.
func over(alloc, used int64) bool {
	return alloc != 0 && used > max(alloc, 0)
}

func TestPropertyEveryReplicaPlacedWhenCapacityUnlimited(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes, ws, opts := genInput(t)
		for i := range nodes {
			nodes[i].Allocatable = Resources{}
		}
		for i := range ws {
			ws[i].NodeSelector = nil
		}
		if len(canonicalNodes(nodes)) == 0 {
			nodes = append(nodes, Node{Name: "only"})
		}
		if p := Assign(nodes, ws, opts); len(p.Pending) > 0 {
			t.Fatalf("pending with unlimited capacity: %v", p.Pending)
		}
	})
}

// TestPropertyUnboundedRendezvousMovesOnlyWhatItMust checks rendezvous
// hashing's defining property (Thaler and Ravishankar 1998): without load
// bounds or spread, removing a node moves only the replicas it held, and
// adding one moves replicas only onto it.
func TestPropertyUnboundedRendezvousMovesOnlyWhatItMust(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 12).Draw(t, "nodes")
		nodes := make([]Node, n)
		for i := range nodes {
			nodes[i] = Node{Name: fmt.Sprintf("n%d", i), Weight: rapid.SampledFrom([]float64{1, 2, 0.5}).Draw(t, "w")}
		}
		ws := uniformWorkloads(rapid.IntRange(1, 60).Draw(t, "workloads"), 1)
		opts := Options{LoadFactor: math.Inf(1)}
		gone := rapid.IntRange(0, n-1).Draw(t, "gone")
		all := Assign(nodes, ws, opts)
		fewer := Assign(slices.Delete(slices.Clone(nodes), gone, gone+1), ws, opts)
		// Both directions are one statement: a replica whose owner differs
		// between the two node sets is owned by the extra node in the
		// larger one.
		for key, owners := range all.Owners {
			if fewer.Owners[key][0] != owners[0] && owners[0] != nodes[gone].Name {
				t.Fatalf("%s: %s with %s, %s without it", key, owners[0], nodes[gone].Name, fewer.Owners[key][0])
			}
		}
	})
}
