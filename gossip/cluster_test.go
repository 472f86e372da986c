package gossip

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// spread waits until every running node of tc has applied r and returns how
// long after t0 the last one did.
func (tc *tcluster) spread(r crdt.Record, t0 time.Time, timeout time.Duration) time.Duration {
	tc.t.Helper()
	var last time.Time
	eventually(tc.t, timeout, func() (bool, string) {
		last = t0
		for _, nd := range tc.up() {
			at, ok := nd.st.appliedAt(r)
			if !ok {
				return false, fmt.Sprintf("%s has not applied %s", nd.name, r.Key)
			}
			if at.After(last) {
				last = at
			}
		}
		return true, ""
	})
	return last.Sub(t0)
}

func TestPublishedWritesConverge(t *testing.T) {
	for _, n := range []int{5, 20} {
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) {
			if n > 5 && testing.Short() {
				t.Skip("-short")
			}
			// Twenty nodes share the test machine's CPUs (with -race, slowly):
			// probe less eagerly so that none is falsely declared dead.
			slower := func(_ int, cfg *Config) {
				if n > 5 {
					cfg.ProbeInterval, cfg.ProbeTimeout = 500*time.Millisecond, 250*time.Millisecond
				}
			}
			tc := newTCluster(t, n, slower)
			tc.joinAll()
			rng := rand.New(rand.NewPCG(1, uint64(n)))
			const writes = 30
			for i := range writes {
				tc.nodes[rng.IntN(n)].publish(t, fmt.Sprintf("test/ns/obj%02d", i), fmt.Sprintf("v%d", i))
			}
			m := tc.waitConverged(20 * time.Second)
			if len(m) != writes {
				t.Fatalf("converged on %d records, want %d", len(m), writes)
			}
			// One more write, timed to the last node.
			t0 := time.Now()
			r := tc.nodes[rng.IntN(n)].publish(t, "test/ns/timed", "x")
			t.Logf("%d nodes: one write reached all in %s", n, tc.spread(r, t0, 10*time.Second))
		})
	}
}

func TestConcurrentWritesToOneKeyEndWithOneWinner(t *testing.T) {
	tc := newTCluster(t, 5, nil)
	tc.joinAll()
	a, b := tc.nodes[1], tc.nodes[3]
	var want []crdt.Record
	for i := range 10 {
		key := fmt.Sprintf("test/conflict/k%d", i)
		ra, rb := a.record(key, "from-a"), b.record(key, "from-b")
		if i%2 == 1 {
			// An exact version tie: Origin decides.
			rb.Version = ra.Version
		}
		var wg sync.WaitGroup
		for _, w := range []struct {
			n *tnode
			r crdt.Record
		}{{a, ra}, {b, rb}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := w.n.c.Publish(w.r); err != nil {
					t.Errorf("Publish: %v", err)
				}
			}()
		}
		wg.Wait()
		want = append(want, winner(ra, rb))
	}
	m := tc.waitConverged(10 * time.Second)
	for _, w := range want {
		if got := m[w.Key]; !got.Equal(w) {
			t.Errorf("%s: converged on %s from %s, want %s from %s", w.Key, got.Value, got.Origin, w.Value, w.Origin)
		}
	}
}

func TestPartitionedWritesConvergeAfterHeal(t *testing.T) {
	tc := newTCluster(t, 6, nil)
	tc.joinAll()
	left, right := tc.nodes[:3], tc.nodes[3:]
	tc.net.Partition([]string{"n00", "n01", "n02"}, []string{"n03", "n04", "n05"})
	eventually(t, 15*time.Second, func() (bool, string) {
		for _, nd := range tc.nodes {
			if nd.c.NumMembers() != 3 {
				return false, fmt.Sprintf("%s sees %d live members, want 3", nd.name, nd.c.NumMembers())
			}
		}
		return true, ""
	})

	left[0].publish(t, "test/left/a", "a")
	left[1].publish(t, "test/both/x", "left")
	right[0].publish(t, "test/right/b", "b")
	time.Sleep(time.Millisecond) // the right side writes x later, so wins
	wantX := right[2].publish(t, "test/both/x", "right")
	for i := range 20 {
		right[i%3].publish(t, fmt.Sprintf("test/right/many%02d", i), "m")
	}

	lm := tc.waitConverged(10*time.Second, left...)
	rm := tc.waitConverged(10*time.Second, right...)
	if _, ok := lm["test/right/b"]; ok {
		t.Fatal("a write crossed the partition")
	}
	if len(lm) != 2 || len(rm) != 22 {
		t.Fatalf("sides hold %d and %d records, want 2 and 22", len(lm), len(rm))
	}

	t0 := time.Now()
	tc.net.Heal()
	tc.waitMembers(6, 20*time.Second)
	m := tc.waitConverged(20 * time.Second)
	t.Logf("healed and converged in %s", time.Since(t0))
	if len(m) != 23 {
		t.Errorf("converged on %d records, want 23", len(m))
	}
	if got := m["test/both/x"]; !got.Equal(wantX) {
		t.Errorf("test/both/x = %s, want %s (the later write)", got.Value, wantX.Value)
	}
}

func TestBigRecordReplicatesToAllNodes(t *testing.T) {
	tc := newTCluster(t, 5, nil)
	tc.joinAll()
	big := tc.nodes[2].publishSized(t, "test/big/blob", 900<<10)
	t0 := time.Now()
	took := tc.spread(big, t0, 20*time.Second)
	t.Logf("900 KiB record reached 5 nodes in %s", took)
	m := tc.waitConverged(10 * time.Second)
	if got := m["test/big/blob"]; !got.Equal(big) {
		t.Fatalf("big record: got %d bytes, want %d", len(got.Value), len(big.Value))
	}
	// A later small write of the same key replaces it everywhere.
	small := tc.nodes[4].publish(t, "test/big/blob", "small")
	if got := tc.waitConverged(10 * time.Second)["test/big/blob"]; !got.Equal(small) {
		t.Fatalf("after small overwrite: got %d bytes", len(got.Value))
	}
}

func TestNodeThatMissedWritesCatchesUpByAntiEntropy(t *testing.T) {
	// n00 starts with 1,000 records nobody else has seen as deltas.
	tc := newTCluster(t, 3, nil, preloadMap(1000, "n00", 100))
	t0 := time.Now()
	tc.joinAll()
	m := tc.waitConverged(20 * time.Second)
	t.Logf("1,000 records reached 2 joiners in %s", time.Since(t0))
	if len(m) != 1000 {
		t.Fatalf("converged on %d records, want 1000", len(m))
	}
	// A fourth node joining later, with writes the others lack, converges
	// both ways.
	late := tc.add(nil, preloadMap(5, "late", 10))
	if _, err := late.c.Join([]string{tc.nodes[1].tr.Addr()}); err != nil {
		t.Fatal(err)
	}
	if m := tc.waitConverged(20 * time.Second); len(m) != 1000 {
		// preloadMap keys overlap: the late node's 5 records lose or win by
		// Version; the union still has 1,000 keys.
		t.Fatalf("converged on %d records, want 1000", len(m))
	}
}

// idleExchangeBytes measures the bytes two nodes that hold the same n
// records send each other in one push/pull (a repeated Join), and the size of
// the digest.
func idleExchangeBytes(t *testing.T, n int) (int64, int) {
	state := preloadMap(n, "n00", 100)
	quiet := func(_ int, cfg *Config) {
		cfg.ProbeInterval = time.Hour
		cfg.PushPullInterval = time.Hour
		cfg.ReconnectInterval = time.Hour
		cfg.GossipInterval = 5 * time.Millisecond
	}
	tc := newTCluster(t, 2, quiet, state, state)
	tc.joinAll()
	time.Sleep(300 * time.Millisecond) // let the join's alive broadcasts drain
	total := func() int64 { return tc.nodes[0].tr.Counters().Total() + tc.nodes[1].tr.Counters().Total() }
	before := total()
	if _, err := tc.nodes[1].c.Join([]string{tc.nodes[0].tr.Addr()}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // any sync would have happened by now
	got := total() - before
	digest := len((&delegate{tc.nodes[0].c}).LocalState(false))
	return got, digest
}

func TestIdleAntiEntropyCostDoesNotGrowWithState(t *testing.T) {
	sizes := []int{10, 1000, 10000}
	bytes := map[int]int64{}
	digests := map[int]int{}
	for _, n := range sizes {
		bytes[n], digests[n] = idleExchangeBytes(t, n)
		t.Logf("%5d records: idle push/pull exchange %d bytes on the wire, digest %d bytes", n, bytes[n], digests[n])
	}
	if digests[10] != digests[10000] {
		t.Errorf("digest is %d bytes at 10 records, %d at 10,000", digests[10], digests[10000])
	}
	// memberlist compresses push/pull streams with LZW: a digest of mostly
	// empty buckets (10 records) shrinks, a full one is random and grows by
	// up to half again. So from 10 to 10,000 records the exchange may grow by
	// that much, both ways, and no more (the entries themselves would take
	// over 300 KB); from 1,000 on, every bucket is full and the size stays.
	if bound := int64(2*digests[10000]*3/2 + 512); bytes[10000]-bytes[10] > bound {
		t.Errorf("idle exchange grew by %d bytes from 10 to 10,000 records (bound %d)", bytes[10000]-bytes[10], bound)
	}
	if d := bytes[10000] - bytes[1000]; d > 256 || d < -256 {
		t.Errorf("idle exchange differs by %d bytes between 1,000 and 10,000 records", d)
	}
}

func TestLeaveShowsLeftAndCrashShowsDead(t *testing.T) {
	tc := newTCluster(t, 4, nil)
	tc.joinAll()
	start := time.Now()

	if err := tc.nodes[1].c.Leave(2 * time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	tc.nodes[1].down = true
	tc.nodes[1].st.markClosed()
	tc.nodes[2].shutdown(t)

	for _, want := range []struct {
		name  string
		state MemberState
	}{{"n01", StateLeft}, {"n02", StateDead}} {
		eventually(t, 10*time.Second, func() (bool, string) {
			for _, nd := range tc.up() {
				if got := memberState(nd, want.name); got != want.state {
					return false, fmt.Sprintf("%s sees %s %q, want %q", nd.name, want.name, got, want.state)
				}
			}
			return true, ""
		})
	}
	for _, m := range tc.nodes[0].c.Members() {
		if (m.Name == "n01" || m.Name == "n02") && !m.Since.After(start) {
			t.Errorf("%s: Since %s not updated", m.Name, m.Since)
		}
	}
	if got := len(tc.nodes[0].c.Members()); got != 4 {
		t.Errorf("Members lists %d nodes, want all 4 ever seen", got)
	}
	if got := tc.nodes[0].c.NumMembers(); got != 2 {
		t.Errorf("NumMembers = %d, want 2", got)
	}
	if err := tc.nodes[1].c.Publish(tc.nodes[1].record("test/x/y", "z")); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Leave: %v, want ErrClosed", err)
	}
}

func TestSuspectIsReportedAndCleared(t *testing.T) {
	// A long suspicion timeout (50 probe intervals) leaves time to see it.
	tc := newTCluster(t, 3, func(_ int, cfg *Config) { cfg.SuspicionMult = 50 })
	tc.joinAll()
	tc.net.Partition([]string{"n00", "n01"}, []string{"n02"})
	eventually(t, 5*time.Second, func() (bool, string) {
		got := memberState(tc.nodes[0], "n02")
		return got == StateSuspect, fmt.Sprintf("n00 sees n02 %q, want suspect", got)
	})
	if got := tc.nodes[0].c.NumMembers(); got != 3 {
		t.Errorf("NumMembers = %d while n02 is only suspect, want 3", got)
	}
	tc.net.Heal()
	eventually(t, 5*time.Second, func() (bool, string) {
		got := memberState(tc.nodes[0], "n02")
		return got == StateAlive, fmt.Sprintf("n00 sees n02 %q after heal, want alive", got)
	})
}

func TestJoinWithWrongKeyFails(t *testing.T) {
	k1 := []byte("0123456789abcdef")
	k2 := []byte("fedcba9876543210")
	for _, tt := range []struct {
		name       string
		seed, join []byte
		wantErr    bool
	}{
		{"same key joins", k1, k1, false},
		{"different keys", k1, k2, true},
		{"joiner without key", k1, nil, true},
		{"joiner with key, cluster without", nil, k1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := newTCluster(t, 2, func(i int, cfg *Config) {
				cfg.SecretKey = tt.seed
				if i == 1 {
					cfg.SecretKey = tt.join
				}
			})
			_, err := tc.nodes[1].c.Join([]string{tc.nodes[0].tr.Addr()})
			if !tt.wantErr {
				if err != nil {
					t.Fatalf("Join: %v", err)
				}
				tc.waitMembers(2, 5*time.Second)
				return
			}
			if !errors.Is(err, ErrKeyMismatch) {
				t.Fatalf("Join error %v, want ErrKeyMismatch", err)
			}
			if !strings.Contains(err.Error(), "gossip key the cluster's?") {
				t.Errorf("error %q does not say what to check", err)
			}
			time.Sleep(300 * time.Millisecond)
			if n := tc.nodes[0].c.NumMembers(); n != 1 {
				t.Errorf("seed sees %d members after a failed join, want 1", n)
			}
		})
	}
}

func TestUpdateMetaReachesPeers(t *testing.T) {
	tc := newTCluster(t, 3, func(i int, cfg *Config) { cfg.Meta = []byte(fmt.Sprintf("api=%d", i)) })
	tc.joinAll()
	if err := tc.nodes[1].c.UpdateMeta([]byte("api=new")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() (bool, string) {
		for _, nd := range tc.nodes {
			for _, m := range nd.c.Members() {
				if m.Name == "n01" && string(m.Meta) != "api=new" {
					return false, fmt.Sprintf("%s sees n01 meta %q", nd.name, m.Meta)
				}
			}
		}
		return true, ""
	})
	if err := tc.nodes[1].c.UpdateMeta(make([]byte, 513)); !errors.Is(err, ErrConfig) {
		t.Errorf("UpdateMeta(513 bytes) = %v, want ErrConfig", err)
	}
}

func TestRTTIsEstimatedFromProbes(t *testing.T) {
	tc := newTCluster(t, 3, nil)
	tc.joinAll()
	c := tc.nodes[0].c
	if d, ok := c.RTT("n00"); !ok || d != 0 {
		t.Errorf("RTT(self) = %s, %v; want 0, true", d, ok)
	}
	if _, ok := c.RTT("nobody"); ok {
		t.Error("RTT(unknown) ok")
	}
	eventually(t, 5*time.Second, func() (bool, string) {
		d, ok := c.RTT("n01")
		return ok && d >= 0 && d < time.Second, fmt.Sprintf("RTT(n01) = %s, %v", d, ok)
	})
}

func TestShutdownStopsGoroutinesAndStateUse(t *testing.T) {
	tc := newTCluster(t, 3, nil)
	tc.joinAll()
	tc.nodes[0].publishSized(t, "test/big/b", 200<<10)
	// Writes keep arriving at n02 while it shuts down; recState fails the
	// test on any use after Shutdown returns.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = tc.nodes[0].c.Publish(tc.nodes[0].record(fmt.Sprintf("test/churn/k%d", i%50), "v"))
			time.Sleep(time.Millisecond)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	tc.nodes[2].shutdown(t)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-done
	for _, nd := range tc.nodes {
		nd.shutdown(t)
	}
	eventually(t, 5*time.Second, func() (bool, string) {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "gossip.(*Cluster)") || strings.Contains(g, "gossip.(*delegate)") {
				return false, "goroutine left running:\n" + g
			}
		}
		return true, ""
	})
	if err := tc.nodes[0].c.Shutdown(); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
	if _, err := tc.nodes[0].c.Join([]string{"127.0.0.1:1"}); !errors.Is(err, ErrClosed) {
		t.Errorf("Join after Shutdown: %v, want ErrClosed", err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		mod  func(*Config)
	}{
		{"no name", func(c *Config) { c.Name = "" }},
		{"name with newline", func(c *Config) { c.Name = "a\nb" }},
		{"name too long", func(c *Config) { c.Name = strings.Repeat("n", 256) }},
		{"key of 15 bytes", func(c *Config) { c.SecretKey = make([]byte, 15) }},
		{"meta of 513 bytes", func(c *Config) { c.Meta = make([]byte, 513) }},
		{"negative interval", func(c *Config) { c.ProbeInterval = -time.Second }},
		{"tiny UDP buffer", func(c *Config) { c.UDPBufferSize = 100 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := fastConfig("n")
			tt.mod(&cfg)
			if c, err := New(cfg, NewMemState()); !errors.Is(err, ErrConfig) {
				if c != nil {
					c.Shutdown()
				}
				t.Fatalf("New = %v, want ErrConfig", err)
			}
		})
	}
	if _, err := New(fastConfig("n"), nil); !errors.Is(err, ErrConfig) {
		t.Errorf("New(nil State) = %v, want ErrConfig", err)
	}
}

func TestPublishRejectsInvalidRecord(t *testing.T) {
	tc := newTCluster(t, 1, nil)
	c := tc.nodes[0].c
	for _, r := range []crdt.Record{
		{Key: "no-slashes", Value: []byte(`1`), Version: hlc.Timestamp{Wall: 1}, Origin: "n00"},
		{Key: "a/b/c", Value: []byte(`not json`), Version: hlc.Timestamp{Wall: 1}, Origin: "n00"},
		{Key: "a/b/c", Value: []byte(`1`), Version: hlc.Timestamp{Wall: 1}},
	} {
		if err := c.Publish(r); !errors.Is(err, crdt.ErrInvalidRecord) {
			t.Errorf("Publish(%+v) = %v, want crdt.ErrInvalidRecord", r, err)
		}
	}
	if tc.nodes[0].st.Len() != 0 {
		t.Error("an invalid record was applied")
	}
}

func TestChangedSignalsRemoteWritesAndMembership(t *testing.T) {
	tc := newTCluster(t, 2, nil)
	ch := tc.nodes[0].c.Changed()
	drain := func() {
		for {
			select {
			case <-ch:
			default:
				return
			}
		}
	}
	wait := func(what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("no Changed signal after %s", what)
		}
	}
	drain()
	tc.joinAll()
	wait("a join")
	time.Sleep(100 * time.Millisecond)
	drain()
	tc.nodes[1].publish(t, "test/changed/k", "v")
	wait("a remote write")
	if got := slices.Collect(func(yield func(string) bool) {
		for _, m := range tc.nodes[0].c.Members() {
			if !yield(m.Name) {
				return
			}
		}
	}); !slices.Equal(got, []string{"n00", "n01"}) {
		t.Errorf("Members = %v, want sorted [n00 n01]", got)
	}
}

// A write whose deltas were all lost reaches the other nodes by the
// digest exchange within about DigestInterval, whatever memberlist's
// push/pull interval (180 s at 1,000 nodes): here push/pull is off, and
// without digest exchanges the write never arrives.
func TestLostDeltaIsRepairedByDigestExchange(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		arrives  bool
	}{
		{"digest exchanges every 200ms", 200 * time.Millisecond, true},
		{"no digest exchange", -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTCluster(t, 3, func(_ int, cfg *Config) {
				cfg.PushPullInterval = time.Hour
				cfg.DigestInterval = tc.interval
			})
			c.joinAll()
			c.waitMembers(3, 10*time.Second)
			// Past the digests a join's push/pull sends a second later
			// (digestAfterJoin), which would carry the write too.
			time.Sleep(1500 * time.Millisecond)
			r := c.nodes[0].record("obj/default/lost", "v")
			enc, err := crdt.EncodeRecord(r)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.nodes[0].c.apply(r, enc, false); err != nil { // stored, never gossiped
				t.Fatal(err)
			}
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				have := 0
				for _, n := range c.nodes[1:] {
					if _, ok, _ := n.st.Get("obj/default/lost"); ok {
						have++
					}
				}
				if have == 2 {
					if !tc.arrives {
						t.Fatal("the lost write arrived without digest exchanges: the test does not test them")
					}
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			if tc.arrives {
				t.Fatal("the lost write did not reach both other nodes in 3 s")
			}
		})
	}
}
