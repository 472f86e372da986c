// Package quorum decides whether a node sees a strict majority of the
// cluster's known nodes, at a cost per node that grows with the logarithm
// of the cluster's size. It is pure: the caller sends the questions Plan
// lists, feeds the answers to a Tracker with the times it sent them, and
// asks the Tracker for the count; time is always a parameter.
//
// # The count
//
// Every node has an ID, the first 64 bits of SHA-256 of its name. The IDs
// form a binary trie: the range of node x at depth d is every node whose
// ID shares its first d bits with x's (depth 0: every node). A node
// counts the nodes of its range at depth d it has fresh evidence of:
//
//   - at its leaf depth L (the smallest depth whose range holds at most
//     LeafSize live members), by asking each of them directly;
//   - at a depth d < L, as its count at depth d+1 plus the count that a
//     member y of the sibling range at depth d+1 (the other half of its
//     depth-d range) gives of its own depth-(d+1) range.
//
// The two halves are disjoint, so counts add up without counting a node
// twice, whatever each node knows of the membership. So each node sends
// at most LeafSize-1 questions to its leaf and one per depth above it:
// about LeafSize + log2(N/LeafSize) a round (Period), and answers as many
// on average. A cluster of at most LeafSize nodes is one leaf: every node
// asks every other, as a plain majority ping would.
//
// # Ages, and why a cut-off minority loses its majority in time
//
// Evidence has an age: a count is a histogram (Hist) of nodes by the age
// of the freshest evidence that they were up and connected to the asker
// through the nodes that answered. An answer is computed after its
// question was sent, so at any later time t its evidence is at most
// t - sent older than when it was computed: the Tracker ages every
// answer by the time since its question left, and a node answering a
// question ages its stored answers the same way before adding them. Ages
// are therefore upper bounds, whatever the network's delays, on any node
// whose clock runs at the right rate (no clock is compared with
// another's). After a partition at time t0 no evidence crosses it, so
// every node of the other side is older than now - t0 in every count on
// this side: with Fresh(T), a side counts only its own nodes from t0 + T
// on, and at most one side of a partition holds a strict majority of the
// known nodes. That is the property the previous design (every node
// pinging every other once a second) had, with N-1 pings per node per
// second.
//
// The price is staleness: evidence from depth 0 has crossed up to L+1
// hops of up to one Period each, so the Period shrinks as L grows
// (PeriodFor) to keep it well under the fence timeout, and a node that
// answers for its range vouches for the nodes in it: a node holding the
// cluster's credentials could claim nodes it never heard from. Counts are
// capped by the members the asker knows in that range, and clusters of at
// most LeafSize nodes ask every node directly (see the threat model).
package quorum

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
	"slices"
	"time"
)

// Quantum is the width of a histogram bucket; Buckets the number of
// buckets: ages up to Quantum*Buckets (12.75 s) are told apart, older
// evidence is dropped. Every hop rounds an age up to a quantum, so a
// finer one keeps the count fresher at the top of a deep trie.
const (
	Quantum = 50 * time.Millisecond
	Buckets = 255
)

// LeafSize is the most live members a node asks directly.
const LeafSize = 16

// Self is the depth of a question about the answerer alone (a direct
// ping): deeper than any trie depth.
const Self = 64

// Hist counts distinct nodes by the age of the freshest evidence that
// they were up: Hist[k] nodes whose age is at most (k+1)*Quantum.
type Hist [Buckets]uint32

// One is a node counting itself: age at most one Quantum.
func One() Hist {
	var h Hist
	h[0] = 1
	return h
}

// Shift returns h aged by d (rounded up to whole quanta); what grows
// past the last bucket is dropped.
func (h Hist) Shift(d time.Duration) Hist {
	if d <= 0 {
		return h
	}
	k := int((d + Quantum - 1) / Quantum)
	var out Hist
	for i := 0; i+k < Buckets; i++ {
		out[i+k] = h[i]
	}
	return out
}

// addShifted adds o aged by d (h = h.Plus(o.Shift(d))) without copying
// either.
func (h *Hist) addShifted(o *Hist, d time.Duration) {
	k := 0
	if d > 0 {
		k = int((d + Quantum - 1) / Quantum)
	}
	for i := 0; i+k < Buckets; i++ {
		h[i+k] += o[i]
	}
}

// Plus returns the counts of h and o added (of disjoint ranges).
func (h Hist) Plus(o Hist) Hist {
	for i := range h {
		h[i] += o[i]
	}
	return h
}

// Total is the number of nodes counted.
func (h Hist) Total() int {
	n := 0
	for _, v := range h {
		n += int(v)
	}
	return n
}

// Fresh is the number of nodes whose age is at most within.
func (h Hist) Fresh(within time.Duration) int {
	n := 0
	for i, v := range h {
		if time.Duration(i+1)*Quantum > within {
			break
		}
		n += int(v)
	}
	return n
}

// Cap keeps at most max nodes, the freshest.
func (h Hist) Cap(max int) Hist {
	for i := range h {
		if int(h[i]) > max {
			h[i] = uint32(max)
		}
		max -= int(h[i])
	}
	return h
}

// ID is a node's place in the trie.
type ID uint64

// IDOf is the ID of node name: the first 64 bits of its SHA-256.
func IDOf(name string) ID {
	sum := sha256.Sum256([]byte(name))
	return ID(binary.BigEndian.Uint64(sum[:8]))
}

// SameRange reports whether a and b are in one range at depth d.
func SameRange(a, b ID, d int) bool {
	if d <= 0 {
		return true
	}
	if d >= 64 {
		return a == b
	}
	return a>>(64-d) == b>>(64-d)
}

// Sibling reports whether b is in the sibling range of a's range at
// depth d (d >= 1): in a's range at depth d-1, not in it at depth d.
func Sibling(a, b ID, d int) bool {
	return SameRange(a, b, d-1) && !SameRange(a, b, d)
}

// Member is a node of the membership.
type Member struct {
	Name string
	ID   ID
}

// Question is one question of a round: ask To for its count at Depth.
// Known is how many of the members Plan was given lie in the range the
// question is about (1 for a direct question): the caller caps the
// answer at it.
type Question struct {
	Depth int
	To    string
	Known int
}

// Plan is one round of questions of node self (by name and ID), given
// the members it can ask (up, self excluded or not): its leaf depth, a
// question at depth Self to each member of its leaf, and one question
// per depth 1..leaf to a member of the sibling range at that depth,
// chosen by rendezvous hashing (Thaler & Ravishankar 1998) of the pair,
// skipping the first skip[depth] candidates (the caller rotates past
// members that did not answer). Sibling ranges with no member get no
// question. It costs O(leaf * len(members)): no sort unless a depth
// skips.
func Plan(self Member, members []Member, skip map[int]int) (leaf int, qs []Question) {
	others := make([]Member, 0, len(members))
	for _, m := range members {
		if m.Name != self.Name {
			others = append(others, m)
		}
	}
	leaf = LeafDepth(self.ID, others)
	for _, m := range others {
		if SameRange(self.ID, m.ID, leaf) {
			qs = append(qs, Question{Depth: Self, To: m.Name, Known: 1})
		}
	}
	var cands []Member
	for d := 1; d <= leaf; d++ {
		cands = cands[:0]
		for _, m := range others {
			if Sibling(self.ID, m.ID, d) {
				cands = append(cands, m)
			}
		}
		if len(cands) == 0 {
			continue
		}
		qs = append(qs, Question{Depth: d, To: heaviest(self.ID, cands, skip[d]%len(cands)).Name, Known: len(cands)})
	}
	return leaf, qs
}

// heaviest is the candidate of rank k (0: the heaviest) by rendezvous
// weight for asker a.
func heaviest(a ID, cands []Member, k int) Member {
	if k == 0 {
		best, bw := cands[0], rendezvous(a, cands[0].ID)
		for _, c := range cands[1:] {
			if w := rendezvous(a, c.ID); w > bw {
				best, bw = c, w
			}
		}
		return best
	}
	type weighted struct {
		w uint64
		i int
	}
	ws := make([]weighted, len(cands))
	for i, c := range cands {
		ws[i] = weighted{rendezvous(a, c.ID), i}
	}
	slices.SortFunc(ws, func(x, y weighted) int { return cmp.Compare(y.w, x.w) })
	return cands[ws[k].i]
}

// LeafDepth is the smallest depth at which self's range holds at most
// LeafSize-1 of others (so at most LeafSize nodes with self).
func LeafDepth(self ID, others []Member) int {
	for d := 0; d < 64; d++ {
		n := 0
		for _, m := range others {
			if SameRange(self, m.ID, d) {
				n++
			}
		}
		if n < LeafSize {
			return d
		}
	}
	return 64
}

// rendezvous is the weight of candidate c for asker a.
func rendezvous(a, c ID) uint64 {
	// A 64-bit mix (splitmix64's finaliser) of the pair.
	x := uint64(a) ^ bits.RotateLeft64(uint64(c), 32) ^ 0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// PeriodFor is the time between rounds for a node at leaf depth leaf,
// with fence timeout T: evidence crosses up to leaf+1 hops of a round
// each, so a round is T/(2(leaf+1)), between 250 ms and 1 s (a leaf of
// the whole cluster asks every node once a second, as before).
func PeriodFor(leaf int, T time.Duration) time.Duration {
	p := T / time.Duration(2*(leaf+1))
	return min(max(p, 250*time.Millisecond), time.Second)
}
