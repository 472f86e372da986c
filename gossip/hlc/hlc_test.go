package hlc

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// fakeClock is a physical clock the test sets by hand.
type fakeClock struct {
	mu sync.Mutex
	ns int64
}

func (f *fakeClock) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Unix(0, f.ns)
}

func (f *fakeClock) set(ns int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ns = ns
}

func TestCompareOrdersByWallThenLogical(t *testing.T) {
	tests := []struct {
		a, b Timestamp
		want int
	}{
		{Timestamp{1, 0}, Timestamp{1, 0}, 0},
		{Timestamp{1, 0}, Timestamp{2, 0}, -1},
		{Timestamp{2, 0}, Timestamp{1, 9}, 1},
		{Timestamp{1, 1}, Timestamp{1, 2}, -1},
		{Timestamp{1, 3}, Timestamp{1, 2}, 1},
		{Timestamp{math.MinInt64, 0}, Timestamp{}, -1},
		{Timestamp{0, math.MaxUint32}, Timestamp{1, 0}, -1},
	}
	for _, tt := range tests {
		if got := tt.a.Compare(tt.b); got != tt.want {
			t.Errorf("%v.Compare(%v) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := tt.b.Compare(tt.a); got != -tt.want {
			t.Errorf("%v.Compare(%v) = %d, want %d", tt.b, tt.a, got, -tt.want)
		}
	}
}

func TestIsZero(t *testing.T) {
	if !(Timestamp{}).IsZero() {
		t.Error("zero Timestamp: IsZero = false")
	}
	for _, ts := range []Timestamp{{Wall: 1}, {Logical: 1}} {
		if ts.IsZero() {
			t.Errorf("%v: IsZero = true", ts)
		}
	}
}

func TestStringFormat(t *testing.T) {
	tests := []struct {
		ts   Timestamp
		want string
	}{
		{Timestamp{1732931234123456789, 3}, "1732931234.123456789,3"},
		{Timestamp{}, "0.000000000,0"},
		{Timestamp{5, 0}, "0.000000005,0"},
		{Timestamp{-1_500_000_000, 7}, "-1.500000000,7"},
		{Timestamp{math.MinInt64, math.MaxUint32}, "-9223372036.854775808,4294967295"},
		{Timestamp{math.MaxInt64, 0}, "9223372036.854775807,0"},
	}
	for _, tt := range tests {
		if got := tt.ts.String(); got != tt.want {
			t.Errorf("String(%#v) = %q, want %q", tt.ts, got, tt.want)
		}
		back, err := Parse(tt.want)
		if err != nil || back != tt.ts {
			t.Errorf("Parse(%q) = %v, %v; want %v", tt.want, back, err, tt.ts)
		}
	}
}

func TestParseRejectsMalformed(t *testing.T) {
	for _, s := range []string{
		"", "1", "1,2", "1.5,2", "1.000000000", "a.000000000,1", "1.000000000,x",
		"1.000000000,4294967296", "9223372036.854775808,0", "-9223372036.854775809,0",
		"99999999999999999999.000000000,0", "1.0000000000,1", "+1.000000000,1", "1.000000000,-1",
	} {
		if ts, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) = %v, want error", s, ts)
		}
	}
}

func TestStringParseRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ts := Timestamp{Wall: rapid.Int64().Draw(t, "wall"), Logical: rapid.Uint32().Draw(t, "logical")}
		back, err := Parse(ts.String())
		if err != nil || back != ts {
			t.Fatalf("Parse(%q) = %v, %v; want %v", ts.String(), back, err, ts)
		}
	})
}

func TestNewNilUsesTimeNow(t *testing.T) {
	before := time.Now().UnixNano()
	got := New(nil).Now()
	after := time.Now().UnixNano()
	if got.Wall < before || got.Wall > after {
		t.Errorf("Now().Wall = %d, want within [%d, %d]", got.Wall, before, after)
	}
}

func TestNowFollowsPhysicalTime(t *testing.T) {
	f := &fakeClock{ns: 100}
	c := New(f.now)
	steps := []struct {
		physical int64
		want     Timestamp
	}{
		{100, Timestamp{100, 0}},
		{100, Timestamp{100, 1}}, // clock stands still: logical counts
		{100, Timestamp{100, 2}},
		{150, Timestamp{150, 0}}, // clock moves: logical resets
		{120, Timestamp{150, 1}}, // clock steps back: never go backwards
		{151, Timestamp{151, 0}},
	}
	for i, s := range steps {
		f.set(s.physical)
		if got := c.Now(); got != s.want {
			t.Fatalf("step %d: Now() at physical %d = %v, want %v", i, s.physical, got, s.want)
		}
	}
}

func TestUpdateCases(t *testing.T) {
	// Each case starts from a clock whose last timestamp is {100, 5}.
	tests := []struct {
		name     string
		physical int64
		remote   Timestamp
		want     Timestamp
	}{
		{"physical ahead of both", 200, Timestamp{150, 9}, Timestamp{200, 0}},
		{"remote ahead", 120, Timestamp{150, 9}, Timestamp{150, 10}},
		{"local ahead", 90, Timestamp{80, 9}, Timestamp{100, 6}},
		{"local and remote equal wall, remote logical higher", 90, Timestamp{100, 9}, Timestamp{100, 10}},
		{"local and remote equal wall, local logical higher", 90, Timestamp{100, 2}, Timestamp{100, 6}},
		{"remote logical at max", 90, Timestamp{150, math.MaxUint32}, Timestamp{151, 0}},
		{"zero remote", 90, Timestamp{}, Timestamp{100, 6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeClock{ns: 100}
			c := New(f.now)
			for range 6 {
				c.Now() // {100,0} .. {100,5}
			}
			f.set(tt.physical)
			got, err := c.Update(tt.remote)
			if err != nil {
				t.Fatalf("Update(%v): %v", tt.remote, err)
			}
			if got != tt.want {
				t.Errorf("Update(%v) = %v, want %v", tt.remote, got, tt.want)
			}
			if got.Compare(tt.remote) <= 0 {
				t.Errorf("Update(%v) = %v, not after remote", tt.remote, got)
			}
		})
	}
}

func TestUpdateRejectsFarFutureRemoteWithoutAdvancing(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	f := &fakeClock{ns: now}
	c := New(f.now)
	first := c.Now()

	// Exactly MaxOffset ahead is still accepted.
	ok := Timestamp{Wall: now + int64(MaxOffset)}
	got, err := c.Update(ok)
	if err != nil || got.Compare(ok) <= 0 {
		t.Fatalf("Update(%v) at exactly MaxOffset = %v, %v; want accepted", ok, got, err)
	}

	f2 := &fakeClock{ns: now}
	c2 := New(f2.now)
	c2.Now()
	for _, remote := range []Timestamp{
		{Wall: now + int64(MaxOffset) + 1},
		{Wall: now + int64(100*365*24*time.Hour)},
		{Wall: math.MaxInt64, Logical: math.MaxUint32},
	} {
		_, err := c2.Update(remote)
		if !errors.Is(err, ErrClockOffset) {
			t.Fatalf("Update(%v) error = %v, want ErrClockOffset", remote, err)
		}
		var oe *OffsetError
		if !errors.As(err, &oe) || oe.Remote != remote || oe.Offset <= MaxOffset {
			t.Errorf("Update(%v) error = %#v, want *OffsetError with Remote and Offset > MaxOffset", remote, err)
		}
		if last := c2.Last(); last != first {
			t.Errorf("after refused Update(%v): Last() = %v, want unchanged %v", remote, last, first)
		}
	}
	if got := c2.Now(); got != (Timestamp{Wall: now, Logical: 1}) {
		t.Errorf("Now after refused updates = %v, want %v", got, Timestamp{Wall: now, Logical: 1})
	}
}

func TestUpdateAcceptsFarPastRemote(t *testing.T) {
	c := New(func() time.Time { return time.Unix(0, 1000) })
	got, err := c.Update(Timestamp{Wall: math.MinInt64})
	if err != nil || got != (Timestamp{Wall: 1000}) {
		t.Errorf("Update(min) = %v, %v; want {1000 0}", got, err)
	}
}

func TestLogicalOverflowBorrowsFromWall(t *testing.T) {
	c := New(func() time.Time { return time.Unix(0, 10) })
	if _, err := c.Update(Timestamp{Wall: 10, Logical: math.MaxUint32 - 1}); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Last(), (Timestamp{10, math.MaxUint32}); got != want {
		t.Fatalf("Last() = %v, want %v", got, want)
	}
	if got, want := c.Now(), (Timestamp{11, 0}); got != want {
		t.Errorf("Now() after logical max = %v, want %v", got, want)
	}
}

// TestClockIsStrictlyMonotonic drives a clock with an arbitrary physical clock
// (jumping forwards and backwards) and arbitrary remote timestamps and checks
// the HLC guarantees after every step.
func TestClockIsStrictlyMonotonic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base := rapid.Int64Range(0, 1<<62).Draw(t, "base")
		f := &fakeClock{ns: base}
		c := New(f.now)
		var prev Timestamp
		maxPhysical := base
		for i := range rapid.IntRange(1, 200).Draw(t, "steps") {
			// Physical time wanders around base by up to 10 ms either way.
			pt := base + rapid.Int64Range(-10e6, 10e6).Draw(t, "physical")
			f.set(pt)
			maxPhysical = max(maxPhysical, pt)
			var got Timestamp
			if rapid.Bool().Draw(t, "remote") {
				remote := Timestamp{
					Wall:    pt + rapid.Int64Range(-int64(2*MaxOffset), int64(2*MaxOffset)).Draw(t, "remoteOffset"),
					Logical: rapid.Uint32().Draw(t, "remoteLogical"),
				}
				var err error
				got, err = c.Update(remote)
				tooFar := remote.Wall-pt > int64(MaxOffset)
				if tooFar != (err != nil) {
					t.Fatalf("step %d: Update(%v) at physical %d: err = %v, want error %v", i, remote, pt, err, tooFar)
				}
				if err != nil {
					if c.Last() != prev {
						t.Fatalf("step %d: refused update moved the clock from %v to %v", i, prev, c.Last())
					}
					continue
				}
				if got.Compare(remote) <= 0 {
					t.Fatalf("step %d: Update(%v) = %v, not after remote", i, remote, got)
				}
				maxPhysical = max(maxPhysical, remote.Wall)
			} else {
				got = c.Now()
			}
			if got.Compare(prev) <= 0 {
				t.Fatalf("step %d: %v not after previous %v", i, got, prev)
			}
			if got.Wall < pt {
				t.Fatalf("step %d: %v behind physical time %d", i, got, pt)
			}
			// Bounded drift (Kulkarni et al. theorem 2): Wall never exceeds the
			// largest physical or accepted remote wall time, except by the
			// nanoseconds borrowed on logical overflow.
			if got.Wall > maxPhysical+int64(i)+1 {
				t.Fatalf("step %d: %v ahead of every physical time seen (%d)", i, got, maxPhysical)
			}
			prev = got
		}
	})
}

func TestClockConcurrentNowIsUnique(t *testing.T) {
	c := New(nil)
	const goroutines, each = 4, 2000
	results := make([][]Timestamp, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range each {
				results[g] = append(results[g], c.Now())
			}
		})
	}
	wg.Wait()
	seen := make(map[Timestamp]bool, goroutines*each)
	for g, rs := range results {
		for i, ts := range rs {
			if seen[ts] {
				t.Fatalf("timestamp %v issued twice", ts)
			}
			seen[ts] = true
			if i > 0 && ts.Compare(rs[i-1]) <= 0 {
				t.Fatalf("goroutine %d: %v not after %v", g, ts, rs[i-1])
			}
		}
	}
}
