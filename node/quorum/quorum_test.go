package quorum

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"testing"
	"time"
)

func members(n int, prefix string) []Member {
	out := make([]Member, n)
	for i := range out {
		name := fmt.Sprintf("%s%04d", prefix, i)
		out[i] = Member{Name: name, ID: IDOf(name)}
	}
	return out
}

func TestHistAgesAddsAndCounts(t *testing.T) {
	q := Quantum
	h := One().Plus(One().Shift(5 * q / 2)) // ages <= q and <= 4q
	if h.Total() != 2 || h.Fresh(q) != 1 || h.Fresh(4*q) != 2 || h.Fresh(7*q/2) != 1 {
		t.Fatalf("hist %v: total %d, fresh %d/%d/%d", h[:5], h.Total(), h.Fresh(q), h.Fresh(4*q), h.Fresh(7*q/2))
	}
	if g := h.Shift(Buckets * Quantum); g.Total() != 0 {
		t.Fatalf("evidence past the horizon kept: %d", g.Total())
	}
	if c := h.Plus(h).Cap(3); c.Total() != 3 || c.Fresh(q) != 2 {
		t.Fatalf("cap keeps the freshest: %v", c[:5])
	}
}

func TestSmallClustersAskEveryMemberDirectly(t *testing.T) {
	ms := members(LeafSize, "n")
	leaf, qs := Plan(ms[0], ms, nil)
	if leaf != 0 || len(qs) != LeafSize-1 {
		t.Fatalf("leaf %d, %d questions; want 0 and %d", leaf, len(qs), LeafSize-1)
	}
	for _, q := range qs {
		if q.Depth != Self {
			t.Fatalf("question %+v is not direct", q)
		}
	}
}

// The questions a node asks per round grow with the logarithm of the
// cluster (one per depth) plus its leaf, and every node asks every
// non-empty sibling range.
func TestQuestionsPerRoundGrowWithTheLogarithm(t *testing.T) {
	for _, n := range []int{100, 1000, 10000} {
		ms := members(n, "node-")
		worst := 0
		for _, self := range ms[:50] {
			leaf, qs := Plan(self, ms, nil)
			worst = max(worst, len(qs))
			levels := map[int]bool{}
			for _, q := range qs {
				levels[q.Depth] = true
			}
			for d := 1; d <= leaf; d++ {
				nonEmpty := false
				for _, m := range ms {
					if Sibling(self.ID, m.ID, d) {
						nonEmpty = true
					}
				}
				if nonEmpty != levels[d] {
					t.Fatalf("N=%d %s depth %d: sibling non-empty %v, asked %v", n, self.Name, d, nonEmpty, levels[d])
				}
			}
		}
		if limit := LeafSize + 2*bits.Len(uint(n/LeafSize)); worst > limit {
			t.Fatalf("N=%d: a node asks %d questions a round, want at most %d", n, worst, limit)
		}
		t.Logf("N=%d: at most %d questions a round", n, worst)
	}
}

// A source silent for longer than the timeout counts again only after
// the settle time: a peer memberlist kept suspect through a partition
// never went dead, so without this the minority counted it at its first
// answer after the heal, regained its quorum on a stale view and started
// an ordinal the majority ran (CI, TestStatefulSetAtMostOneUnderPartition).
func TestSourceBackFromSilenceCountsOnlyAfterSettle(t *testing.T) {
	const timeout, settle = 3 * time.Second, 10 * time.Second
	t0 := time.Date(2026, 12, 1, 11, 5, 50, 0, time.UTC)
	ms := members(3, "n")
	tr := NewTracker(ms[0], timeout, settle)
	tr.SetLeaf(0, ms)
	ans := func(name string, at time.Time, unheard bool) bool {
		return tr.Answer(Self, name, IDOf(name), One(), at.Add(-time.Millisecond), at, unheard)
	}
	counts := func(at time.Time) int { return tr.Seen(at, nil) }
	if ans("n0001", t0, false) || counts(t0.Add(time.Second)) != 2 {
		t.Fatal("a peer answering in the first round counts at once")
	}
	for at := t0.Add(time.Second); at.Before(t0.Add(3 * time.Second)); at = at.Add(time.Second) {
		if ans("n0001", at, false) {
			t.Fatalf("answers a second apart flagged as a silence at %v", at)
		}
	}
	if counts(t0.Add(10*time.Second)) != 1 {
		t.Fatal("a silent peer counts")
	}
	heal := t0.Add(26 * time.Second)
	if !ans("n0001", heal, false) {
		t.Fatal("the first answer after 24 s of silence must start a settle")
	}
	for at := heal; at.Before(heal.Add(settle)); at = at.Add(time.Second) {
		ans("n0001", at, false)
		if counts(at) != 1 {
			t.Fatalf("counted %v after the heal, before the settle", at.Sub(heal))
		}
	}
	ans("n0001", heal.Add(settle), false)
	if counts(heal.Add(settle)) != 2 {
		t.Fatal("a settled peer does not count")
	}
	// First heard while fenced: a silence too.
	if !ans("n0002", heal.Add(settle), true) || counts(heal.Add(settle+time.Second)) != 2 {
		t.Fatal("a peer first heard while fenced must settle")
	}
}

// simNet runs the protocol on n trackers in discrete time: each node runs
// a round every PeriodFor(leaf) and gets each answer 2 ms after asking,
// if the asked node is on its side of the partition (side[i]).
type simNet struct {
	ms    []Member
	tr    []*Tracker
	next  []time.Time
	skip  []map[int]int
	side  []int
	index map[string]int
	now   time.Time
}

func newSimNet(n int, timeout, settle time.Duration, seed uint64) *simNet {
	s := &simNet{ms: members(n, fmt.Sprintf("s%d-", seed)), index: map[string]int{}, now: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)}
	rng := rand.New(rand.NewPCG(seed, 7))
	for i, m := range s.ms {
		s.tr = append(s.tr, NewTracker(m, timeout, settle))
		s.next = append(s.next, s.now.Add(time.Duration(rng.IntN(1000))*time.Millisecond))
		s.skip = append(s.skip, map[int]int{})
		s.side = append(s.side, 0)
		s.index[m.Name] = i
	}
	return s
}

// run advances d in 10 ms steps, calling check after each.
func (s *simNet) run(d time.Duration, check func()) {
	end := s.now.Add(d)
	for s.now.Before(end) {
		s.now = s.now.Add(10 * time.Millisecond)
		for i, tr := range s.tr {
			if s.now.Before(s.next[i]) {
				continue
			}
			leaf, qs := Plan(tr.Self, s.ms, s.skip[i])
			tr.SetLeaf(leaf, s.ms)
			for _, q := range qs {
				j := s.index[q.To]
				if s.side[j] != s.side[i] {
					if q.Depth != Self {
						s.skip[i][q.Depth]++
					}
					continue
				}
				var h Hist
				if q.Depth == Self {
					h = One()
				} else {
					h = s.tr[j].Count(q.Depth, s.now.Add(time.Millisecond), nil)
				}
				tr.Answer(q.Depth, q.To, s.ms[j].ID, h, s.now, s.now.Add(2*time.Millisecond), false)
			}
			s.next[i] = s.now.Add(PeriodFor(leaf, tr.Timeout))
		}
		if check != nil {
			check()
		}
	}
}

// majorities counts the nodes of each side holding a strict majority.
func (s *simNet) majorities() map[int]int {
	out := map[int]int{}
	for i, tr := range s.tr {
		if 2*tr.Seen(s.now, nil) > len(s.ms) {
			out[s.side[i]]++
		}
	}
	return out
}

// TestAtMostOneSideOfAPartitionHoldsAMajority is the fencing property:
// fence timeout T after a partition, no node of a minority side counts a
// majority (so at most one side runs StatefulSet replicas), while every
// node of a majority side keeps one; after the heal every node counts
// one again. Partitions: random sides, and trie-aligned ones (a whole
// range of IDs on one side), near half and far from it.
func TestAtMostOneSideOfAPartitionHoldsAMajority(t *testing.T) {
	const T, settle = 3 * time.Second, 10 * time.Second
	for _, n := range []int{12, 60, 300} {
		for _, split := range []struct {
			name    string
			aligned bool
			frac    float64
		}{{"random 45%", false, 0.45}, {"random 30%", false, 0.30}, {"aligned half-1", true, 0}, {"random 49%", false, 0.49}} {
			t.Run(fmt.Sprintf("N=%d %s", n, split.name), func(t *testing.T) {
				s := newSimNet(n, T, settle, uint64(n))
				s.run(5*time.Second, nil)
				if m := s.majorities(); m[0] != n {
					t.Fatalf("healthy cluster: %d of %d nodes count a majority", m[0], n)
				}
				// Cut: the minority is side 1.
				minority := int(split.frac * float64(n))
				rng := rand.New(rand.NewPCG(uint64(n), 99))
				if split.aligned {
					// The half of the trie holding fewer nodes, and then
					// its largest range short of a majority.
					for i, m := range s.ms {
						if m.ID>>63 == 1 {
							s.side[i] = 1
						}
					}
					ones := 0
					for _, v := range s.side {
						ones += v
					}
					if 2*ones >= n {
						for i := range s.side {
							s.side[i] ^= 1
						}
					}
				} else {
					for _, i := range rng.Perm(n)[:minority] {
						s.side[i] = 1
					}
				}
				cut := s.now
				s.run(2*T, func() {
					m := s.majorities()
					if m[0] > 0 && m[1] > 0 && s.now.Sub(cut) > T {
						t.Fatalf("%v after the cut both sides count a majority: %v", s.now.Sub(cut), m)
					}
					if m[1] > 0 && s.now.Sub(cut) > T {
						t.Fatalf("%v after the cut %d minority nodes still count a majority", s.now.Sub(cut), m[1])
					}
				})
				maj := 0
				for _, v := range s.side {
					if v == 0 {
						maj++
					}
				}
				if m := s.majorities(); 2*maj > n && m[0] != maj {
					t.Fatalf("majority side of %d: only %d count a majority", maj, m[0])
				}
				for i := range s.side {
					s.side[i] = 0
				}
				s.run(settle+3*T, nil)
				if m := s.majorities(); m[0] != n {
					t.Fatalf("after the heal: %d of %d nodes count a majority", m[0], n)
				}
			})
		}
	}
}

// FuzzDecodeHist: an answer from a peer never panics the decoder, and
// what decodes encodes back to the same bytes.
func FuzzDecodeHist(f *testing.F) {
	f.Add(EncodeHist(One()))
	f.Add(EncodeHist(One().Plus(One().Shift(time.Second))))
	f.Add([]byte{2, 5, 1, 5, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHist(b)
		if err != nil {
			return
		}
		if got := EncodeHist(h); string(got) != string(b) {
			t.Fatalf("%x decodes to a hist that encodes as %x", b, got)
		}
	})
}
