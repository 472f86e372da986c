package crdt

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/starling-orchestrator/starling/gossip/hlc"
)

func ts(wall int64, logical uint32) hlc.Timestamp { return hlc.Timestamp{Wall: wall, Logical: logical} }

func live(key string, v hlc.Timestamp, origin, value string) Record {
	return Record{Key: key, Value: json.RawMessage(value), Version: v, Origin: origin}
}

func tomb(key string, v hlc.Timestamp, origin string) Record {
	return Record{Key: key, Version: v, Origin: origin, Deleted: true}
}

func TestWins(t *testing.T) {
	const k = "svc/default/web"
	tests := []struct {
		name string
		r, o Record
		want bool
	}{
		{"higher wall wins", live(k, ts(2, 0), "a", `1`), live(k, ts(1, 9), "z", `9`), true},
		{"lower wall loses", live(k, ts(1, 9), "z", `9`), live(k, ts(2, 0), "a", `1`), false},
		{"higher logical wins", live(k, ts(1, 2), "a", `1`), live(k, ts(1, 1), "z", `1`), true},
		{"lower logical loses", live(k, ts(1, 1), "z", `1`), live(k, ts(1, 2), "a", `1`), false},
		{"equal version, higher origin wins", live(k, ts(1, 0), "node-b", `1`), live(k, ts(1, 0), "node-a", `9`), true},
		{"equal version, lower origin loses", live(k, ts(1, 0), "node-a", `9`), live(k, ts(1, 0), "node-b", `1`), false},
		{"origin compares bytewise", live(k, ts(1, 0), "node-a", `1`), live(k, ts(1, 0), "Node-z", `1`), true},
		{"newer live beats older tombstone", live(k, ts(2, 0), "a", `1`), tomb(k, ts(1, 0), "a"), true},
		{"newer tombstone beats older live", tomb(k, ts(2, 0), "a"), live(k, ts(1, 0), "z", `1`), true},
		{"equal version and origin, tombstone beats live", tomb(k, ts(1, 0), "a"), live(k, ts(1, 0), "a", `1`), true},
		{"equal version and origin, live loses to tombstone", live(k, ts(1, 0), "a", `1`), tomb(k, ts(1, 0), "a"), false},
		{"all equal, larger value wins", live(k, ts(1, 0), "a", `{"b":2}`), live(k, ts(1, 0), "a", `{"b":1}`), true},
		{"all equal, smaller value loses", live(k, ts(1, 0), "a", `{"b":1}`), live(k, ts(1, 0), "a", `{"b":2}`), false},
		{"longer value with same prefix wins", live(k, ts(1, 0), "a", `12`), live(k, ts(1, 0), "a", `1`), true},
		{"identical live records: neither wins", live(k, ts(1, 0), "a", `1`), live(k, ts(1, 0), "a", `1`), false},
		{"identical tombstones: neither wins", tomb(k, ts(1, 0), "a"), tomb(k, ts(1, 0), "a"), false},
		{"anything beats the zero record", live(k, ts(0, 0), "a", ``), Record{}, true},
		{"negative wall loses to zero", live(k, ts(-1, 0), "z", `1`), live(k, ts(0, 0), "a", `1`), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Wins(tt.o); got != tt.want {
				t.Errorf("Wins = %v, want %v\n r = %+v\n o = %+v", got, tt.want, tt.r, tt.o)
			}
			if got, want := merge(tt.r, tt.o), merge(tt.o, tt.r); !got.Equal(want) {
				t.Errorf("Merge not symmetric: %+v vs %+v", got, want)
			}
		})
	}
}

func TestEqualTreatsNilAndEmptyValueAlike(t *testing.T) {
	a := Record{Key: "a/b/c", Origin: "n", Value: nil}
	b := Record{Key: "a/b/c", Origin: "n", Value: json.RawMessage{}}
	if !a.Equal(b) || a.Wins(b) || b.Wins(a) {
		t.Errorf("nil and empty Value: Equal=%v a.Wins=%v b.Wins=%v", a.Equal(b), a.Wins(b), b.Wins(a))
	}
}

// genRecord draws records from small domains so that equal versions, origins
// and values, the tie-break paths, are common.
func genRecord(keys ...string) *rapid.Generator[Record] {
	if len(keys) == 0 {
		keys = []string{"svc/default/web"}
	}
	return rapid.Custom(func(t *rapid.T) Record {
		r := Record{
			Key:     rapid.SampledFrom(keys).Draw(t, "key"),
			Version: ts(rapid.Int64Range(1, 4).Draw(t, "wall"), rapid.Uint32Range(0, 2).Draw(t, "logical")),
			Origin:  rapid.SampledFrom([]string{"n1", "n2", "n3"}).Draw(t, "origin"),
			Deleted: rapid.Bool().Draw(t, "deleted"),
		}
		if !r.Deleted {
			r.Value = json.RawMessage(rapid.SampledFrom([]string{`1`, `2`, `{"a":1}`, `"x"`}).Draw(t, "value"))
		}
		return r
	})
}

func TestMergeIsCommutative(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := genRecord().Draw(t, "a"), genRecord().Draw(t, "b")
		if ab, ba := merge(a, b), merge(b, a); !ab.Equal(ba) {
			t.Fatalf("merge(a,b) = %+v, merge(b,a) = %+v", ab, ba)
		}
	})
}

func TestMergeIsAssociative(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b, c := genRecord().Draw(t, "a"), genRecord().Draw(t, "b"), genRecord().Draw(t, "c")
		if l, r := merge(merge(a, b), c), merge(a, merge(b, c)); !l.Equal(r) {
			t.Fatalf("(a∨b)∨c = %+v, a∨(b∨c) = %+v", l, r)
		}
	})
}

func TestMergeIsIdempotent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := genRecord().Draw(t, "a"), genRecord().Draw(t, "b")
		if got := merge(a, a); !got.Equal(a) {
			t.Fatalf("merge(a,a) = %+v, want %+v", got, a)
		}
		ab := merge(a, b)
		if got := merge(ab, b); !got.Equal(ab) {
			t.Fatalf("merge(merge(a,b),b) = %+v, want %+v", got, ab)
		}
	})
}

// TestWinsIsStrictTotalOrder guards what makes merge deterministic: for any
// two records exactly one of "a wins", "b wins", "equal" holds, and winning is
// transitive.
func TestWinsIsStrictTotalOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := genRecord("a/b/c", "a/b/d")
		a, b, c := g.Draw(t, "a"), g.Draw(t, "b"), g.Draw(t, "c")
		n := 0
		for _, held := range []bool{a.Wins(b), b.Wins(a), a.Equal(b)} {
			if held {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("a.Wins(b)=%v b.Wins(a)=%v Equal=%v", a.Wins(b), b.Wins(a), a.Equal(b))
		}
		if a.Wins(b) && b.Wins(c) && !a.Wins(c) {
			t.Fatalf("not transitive: a>b>c but not a>c")
		}
	})
}

func TestMapApplyReportsChange(t *testing.T) {
	const k = "svc/default/web"
	m := Map{}
	steps := []struct {
		r       Record
		changed bool
	}{
		{live(k, ts(2, 0), "a", `1`), true},  // new key
		{live(k, ts(2, 0), "a", `1`), false}, // duplicate
		{live(k, ts(1, 0), "z", `2`), false}, // older
		{tomb(k, ts(3, 0), "b"), true},       // newer delete
		{live(k, ts(2, 5), "z", `3`), false}, // older than the tombstone: stays deleted
		{live(k, ts(4, 0), "a", `4`), true},  // re-create after delete
	}
	for i, s := range steps {
		if got := m.Apply(s.r); got != s.changed {
			t.Errorf("step %d: Apply(%+v) = %v, want %v", i, s.r, got, s.changed)
		}
	}
	if got := m[k]; !got.Equal(steps[5].r) {
		t.Errorf("final record = %+v, want %+v", got, steps[5].r)
	}
}

func TestMergeMapsLeavesInputsAlone(t *testing.T) {
	a := Map{"k/n/1": live("k/n/1", ts(1, 0), "a", `1`), "k/n/2": live("k/n/2", ts(5, 0), "a", `1`)}
	b := Map{"k/n/1": live("k/n/1", ts(2, 0), "b", `2`), "k/n/3": tomb("k/n/3", ts(1, 0), "b")}
	got := mergeMaps(a, b)
	want := Map{"k/n/1": b["k/n/1"], "k/n/2": a["k/n/2"], "k/n/3": b["k/n/3"]}
	if !mapsEqual(got, want) {
		t.Errorf("MergeMaps = %v, want %v", got, want)
	}
	if len(a) != 2 || a["k/n/1"].Version != ts(1, 0) || len(b) != 2 {
		t.Errorf("inputs modified: a=%v b=%v", a, b)
	}
	if got := mergeMaps(nil, nil); got == nil || len(got) != 0 {
		t.Errorf("mergeMaps(nil, nil) = %#v, want empty non-nil map", got)
	}
}

func TestMapRecordsSortedByKey(t *testing.T) {
	m := Map{}
	for _, k := range []string{"b/x/y", "a/z/z", "a/a/a", "svc/ns/b"} {
		m.Apply(live(k, ts(1, 0), "n", `1`))
	}
	var got []string
	for _, r := range m.Records() {
		got = append(got, r.Key)
	}
	if want := "[a/a/a a/z/z b/x/y svc/ns/b]"; fmt.Sprint(got) != want {
		t.Errorf("Records keys = %v, want %v", got, want)
	}
}

func mapsEqual(a, b Map) bool {
	if len(a) != len(b) {
		return false
	}
	for k, r := range a {
		o, ok := b[k]
		if !ok || !r.Equal(o) {
			return false
		}
	}
	return true
}

// TestReplicasConverge delivers one set of writes to several replicas, each in
// its own order, with duplicates, and with some writes lost and redelivered
// later (as anti-entropy would), and checks that every replica ends with the
// same map: for every key, the greatest write under Wins.
func TestReplicasConverge(t *testing.T) {
	keys := []string{"svc/default/web", "svc/default/db", "deploy/edge/cam"}
	rapid.Check(t, func(t *rapid.T) {
		writes := rapid.SliceOfN(genRecord(keys...), 1, 30).Draw(t, "writes")
		want := Map{}
		for _, w := range writes {
			if cur, ok := want[w.Key]; !ok || w.Wins(cur) {
				want[w.Key] = w
			}
		}

		replicas := rapid.IntRange(2, 5).Draw(t, "replicas")
		for i := range replicas {
			order := rapid.Permutation(indices(len(writes))).Draw(t, fmt.Sprintf("order%d", i))
			var delivery, lost []int
			for _, w := range order {
				switch rapid.IntRange(0, 3).Draw(t, "fate") {
				case 0: // lost now, redelivered at the end
					lost = append(lost, w)
				case 1: // duplicated
					delivery = append(delivery, w, w)
				default:
					delivery = append(delivery, w)
				}
			}
			lost = rapid.Permutation(lost).Draw(t, "redelivery")
			delivery = append(delivery, lost...)
			// Replay some already delivered writes once more at the very end.
			delivery = append(delivery, rapid.SliceOfN(rapid.SampledFrom(order), 0, 5).Draw(t, "replay")...)

			m := Map{}
			for _, w := range delivery {
				before, had := m[writes[w].Key]
				changed := m.Apply(writes[w])
				if changed == (had && before.Equal(m[writes[w].Key])) {
					t.Fatalf("replica %d: Apply(%+v) = %v, but map went from %+v to %+v",
						i, writes[w], changed, before, m[writes[w].Key])
				}
			}
			if !mapsEqual(m, want) {
				t.Fatalf("replica %d diverged:\n got %v\nwant %v", i, m, want)
			}
		}
	})
}

// TestStateMergeConverges checks the state-based path (full-state anti-entropy):
// replicas holding arbitrary subsets of the writes, merged pairwise in any
// order and grouping, end with the map of all writes.
func TestStateMergeConverges(t *testing.T) {
	keys := []string{"svc/default/web", "svc/default/db"}
	rapid.Check(t, func(t *rapid.T) {
		writes := rapid.SliceOfN(genRecord(keys...), 1, 20).Draw(t, "writes")
		n := rapid.IntRange(2, 4).Draw(t, "replicas")
		states := make([]Map, n)
		for i := range states {
			states[i] = Map{}
		}
		want := Map{}
		for _, w := range writes {
			want.Apply(w)
			// Every write reaches at least one replica.
			states[rapid.IntRange(0, n-1).Draw(t, "holder")].Apply(w)
		}
		order := rapid.Permutation(indices(n)).Draw(t, "order")
		acc := Map(nil)
		for _, i := range order {
			if rapid.Bool().Draw(t, "accFirst") {
				acc = mergeMaps(acc, states[i])
			} else {
				acc = mergeMaps(states[i], acc)
			}
		}
		if !mapsEqual(acc, want) {
			t.Fatalf("merged state = %v, want %v", acc, want)
		}
	})
}

func indices(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func TestExpired(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	ttl := time.Hour
	at := func(d time.Duration) hlc.Timestamp { return ts(now.Add(d).UnixNano(), 0) }
	tests := []struct {
		name string
		r    Record
		ttl  time.Duration
		want bool
	}{
		{"old tombstone", tomb("a/b/c", at(-2*time.Hour), "n"), ttl, true},
		{"tombstone just past ttl", tomb("a/b/c", at(-ttl-1), "n"), ttl, true},
		{"tombstone exactly ttl old", tomb("a/b/c", at(-ttl), "n"), ttl, false},
		{"fresh tombstone", tomb("a/b/c", at(-time.Minute), "n"), ttl, false},
		{"future tombstone", tomb("a/b/c", at(time.Hour), "n"), ttl, false},
		{"old live record never expires", live("a/b/c", at(-1000*time.Hour), "n", `1`), ttl, false},
		{"zero ttl: any past tombstone", tomb("a/b/c", at(-1), "n"), 0, true},
		{"negative ttl: even slightly future tombstone", tomb("a/b/c", at(time.Second), "n"), -time.Minute, true},
		{"hostile min wall", tomb("a/b/c", ts(math.MinInt64, 0), "n"), ttl, true},
		{"hostile max wall", tomb("a/b/c", ts(math.MaxInt64, 0), "n"), ttl, false},
		{"huge ttl, 1970 tombstone", tomb("a/b/c", ts(0, 0), "n"), time.Duration(math.MaxInt64), false},
		{"huge ttl, min wall tombstone", tomb("a/b/c", ts(math.MinInt64, 0), "n"), time.Duration(math.MaxInt64), true},
		{"huge negative ttl does not overflow", tomb("a/b/c", ts(math.MaxInt64-1, 0), "n"), time.Duration(math.MinInt64), true},
	}
	for _, tt := range tests {
		if got := tt.r.Expired(now, tt.ttl); got != tt.want {
			t.Errorf("%s: Expired = %v, want %v", tt.name, got, tt.want)
		}
	}
	// now - ttl below math.MinInt64 saturates instead of wrapping to the future.
	early := time.Unix(0, math.MinInt64+10)
	if tomb("a/b/c", ts(math.MaxInt64, 0), "n").Expired(early, time.Hour) {
		t.Error("now near MinInt64: max-wall tombstone reported expired")
	}
}

// merge is the join of two writes of one key as Map.Apply takes it: the
// winner by Record.Wins. The properties below are those of Wins.
func merge(a, b Record) Record {
	if b.Wins(a) {
		return b
	}
	return a
}

// mergeMaps is a new Map with, for every key of a or b, the winner of the
// two, by Map.Apply; a and b are left alone.
func mergeMaps(a, b Map) Map {
	out := a.Clone()
	for _, r := range b {
		out.Apply(r)
	}
	return out
}
