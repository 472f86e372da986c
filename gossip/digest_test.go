package gossip

import (
	"fmt"
	"slices"
	"testing"

	"github.com/hashicorp/memberlist"
	"pgregory.net/rapid"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

func ent(key string, wall int64, origin string, deleted bool, hash uint64) entry {
	return entry{Key: key, Version: hlc.Timestamp{Wall: wall}, Origin: origin, Deleted: deleted, Hash: hash}
}

func TestPlan(t *testing.T) {
	for _, tt := range []struct {
		name          string
		local, remote []entry
		send, pull    []string
	}{
		{"both empty", nil, nil, nil, nil},
		{"same", []entry{ent("a/b/c", 1, "n", false, 7)}, []entry{ent("a/b/c", 1, "n", false, 7)}, nil, nil},
		{"remote lacks", []entry{ent("a/b/c", 1, "n", false, 7)}, nil, []string{"a/b/c"}, nil},
		{"local lacks", nil, []entry{ent("a/b/c", 1, "n", false, 7)}, nil, []string{"a/b/c"}},
		{"local newer", []entry{ent("a/b/c", 2, "n", false, 7)}, []entry{ent("a/b/c", 1, "n", false, 8)}, []string{"a/b/c"}, nil},
		{"remote newer", []entry{ent("a/b/c", 1, "n", false, 7)}, []entry{ent("a/b/c", 2, "n", false, 8)}, nil, []string{"a/b/c"}},
		{"origin breaks tie", []entry{ent("a/b/c", 1, "m", false, 7)}, []entry{ent("a/b/c", 1, "n", false, 8)}, nil, []string{"a/b/c"}},
		{"tombstone breaks tie", []entry{ent("a/b/c", 1, "n", true, 7)}, []entry{ent("a/b/c", 1, "n", false, 8)}, []string{"a/b/c"}, nil},
		{"only values differ: both ways", []entry{ent("a/b/c", 1, "n", false, 7)}, []entry{ent("a/b/c", 1, "n", false, 8)}, []string{"a/b/c"}, []string{"a/b/c"}},
		{
			"interleaved",
			[]entry{ent("a/b/1", 1, "n", false, 1), ent("a/b/3", 5, "n", false, 3), ent("a/b/5", 1, "n", false, 5)},
			[]entry{ent("a/b/2", 1, "n", false, 2), ent("a/b/3", 4, "n", false, 3), ent("a/b/5", 1, "n", false, 5), ent("a/b/6", 1, "n", false, 6)},
			[]string{"a/b/1", "a/b/3"}, []string{"a/b/2", "a/b/6"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			send, pull := plan(tt.local, tt.remote)
			if !slices.Equal(send, tt.send) || !slices.Equal(pull, tt.pull) {
				t.Fatalf("plan = send %v pull %v, want send %v pull %v", send, pull, tt.send, tt.pull)
			}
		})
	}
}

// genRecord draws a record of key "a/b/c" from a small space, so that ties on
// Version, Origin and Deleted are common.
func genRecord(t *rapid.T, label string) crdt.Record {
	r := crdt.Record{
		Key:     "a/b/c",
		Version: hlc.Timestamp{Wall: rapid.Int64Range(0, 2).Draw(t, label+".wall"), Logical: rapid.Uint32Range(0, 1).Draw(t, label+".logical")},
		Origin:  rapid.SampledFrom([]string{"m", "n"}).Draw(t, label+".origin"),
		Deleted: rapid.Bool().Draw(t, label+".deleted"),
	}
	if !r.Deleted {
		r.Value = []byte(rapid.SampledFrom([]string{`1`, `2`}).Draw(t, label+".value"))
	}
	return r
}

// Whatever two records a pair of nodes hold for a key, the exchange plan
// directs leads both to winner of the two.
func TestPlanAgreesWithMerge(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := genRecord(t, "a"), genRecord(t, "b")
		encA, _ := crdt.EncodeRecord(a)
		encB, _ := crdt.EncodeRecord(b)
		send, pull := plan([]entry{entryOf(a, encA)}, []entry{entryOf(b, encB)})
		gotA, gotB := a, b
		if len(pull) == 1 {
			gotA = winner(gotA, b)
		}
		if len(send) == 1 {
			gotB = winner(gotB, a)
		}
		want := winner(a, b)
		if !gotA.Equal(want) || !gotB.Equal(want) {
			t.Fatalf("a=%+v b=%+v: send %v pull %v leaves %+v and %+v, want %+v", a, b, send, pull, gotA, gotB, want)
		}
	})
}

func TestIndexDigestDependsOnlyOnContent(t *testing.T) {
	m := preloadMap(500, "n", 10)
	recs := m.Records()
	x, y := newIndex(), newIndex()
	for _, r := range recs {
		enc, _ := crdt.EncodeRecord(r)
		x.put(entryOf(r, enc))
	}
	// y: reverse order, and every record first put in an older version.
	for _, r := range slices.Backward(recs) {
		old := r
		old.Version.Wall--
		old.Value = []byte(`"old"`)
		encOld, _ := crdt.EncodeRecord(old)
		y.put(entryOf(old, encOld))
		enc, _ := crdt.EncodeRecord(r)
		y.put(entryOf(r, enc))
	}
	if x.sums() != y.sums() {
		t.Fatal("equal contents, different digests")
	}
	z := newIndex()
	if err := z.reset(m); err != nil {
		t.Fatal(err)
	}
	if x.sums() != z.sums() || z.len() != 500 {
		t.Fatal("reset from the map gives a different digest")
	}
	// One changed record changes exactly its bucket.
	r := recs[17]
	r.Version.Wall++
	enc, _ := crdt.EncodeRecord(r)
	y.put(entryOf(r, enc))
	xs, ys := x.sums(), y.sums()
	if diff := diffBuckets(&xs, &ys); !slices.Equal(diff, []uint8{bucketOf(r.Key)}) {
		t.Fatalf("diff %v, want [%d]", diff, bucketOf(r.Key))
	}
}

// Object keys differ mostly in their last characters; they must still spread
// over the buckets, or a digest bucket would hold most records.
func TestBucketsSpreadSimilarKeys(t *testing.T) {
	var counts [numBuckets]int
	const n = 256 * 40
	for i := range n {
		counts[bucketOf(fmt.Sprintf("replica/default/web-%d", i))]++
	}
	lo, hi := slices.Min(counts[:]), slices.Max(counts[:])
	// Binomial(10240, 1/256): mean 40, sd 6.3; allow about 4 sd.
	if lo < 15 || hi > 65 {
		t.Fatalf("bucket sizes range %d..%d for a mean of 40", lo, hi)
	}
}

func TestQueuedDeltaOfAKeyReplacesTheOlder(t *testing.T) {
	q := &memberlist.TransmitLimitedQueue{NumNodes: func() int { return 10 }, RetransmitMult: 4}
	q.QueueBroadcast(&broadcast{key: "a/b/c", msg: []byte("old")})
	q.QueueBroadcast(&broadcast{key: "a/b/d", msg: []byte("other")})
	q.QueueBroadcast(&broadcast{key: "a/b/c", msg: []byte("new")})
	if n := q.NumQueued(); n != 2 {
		t.Fatalf("%d queued, want 2", n)
	}
	got := q.GetBroadcasts(0, 1000)
	slices.SortFunc(got, func(a, b []byte) int { return slices.Compare(a, b) })
	if len(got) != 2 || string(got[0]) != "new" || string(got[1]) != "other" {
		t.Fatalf("broadcasts %q", got)
	}
	b := &broadcast{key: "a/b/c"}
	if !b.Invalidates(&broadcast{key: "a/b/c"}) || b.Invalidates(&broadcast{key: "a/b/d"}) {
		t.Fatal("Invalidates does not match names")
	}
}

// winner is the write of a and b that a store keeps (crdt.Record.Wins).
func winner(a, b crdt.Record) crdt.Record {
	if b.Wins(a) {
		return b
	}
	return a
}
