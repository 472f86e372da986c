package gossip

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// TestFigures measures, with memberlist's LAN defaults (GossipInterval
// 200 ms, ProbeInterval 1 s, PushPullInterval 30 s) on loopback:
//
//   - the time for one write to reach every node, for 5, 20 and 50 nodes
//     (median and p99 of 20 writes from random nodes);
//   - the idle gossip traffic per node of a 20-node cluster, over a window of
//     GOSSIP_FIGURES_WINDOW (default 60s), empty and with 1,000 records.
//
// It takes a few minutes, so it runs only with GOSSIP_FIGURES=1:
//
//	GOSSIP_FIGURES=1 go test ./gossip/ -run TestFigures -v -timeout 20m
func TestFigures(t *testing.T) {
	if os.Getenv("GOSSIP_FIGURES") == "" {
		t.Skip("set GOSSIP_FIGURES=1 to measure")
	}
	window := time.Minute
	if w, err := time.ParseDuration(os.Getenv("GOSSIP_FIGURES_WINDOW")); err == nil {
		window = w
	}
	lan := func(_ int, cfg *Config) {
		d := DefaultConfig()
		cfg.ProbeInterval, cfg.ProbeTimeout, cfg.SuspicionMult = d.ProbeInterval, d.ProbeTimeout, d.SuspicionMult
		cfg.GossipInterval, cfg.PushPullInterval, cfg.ReconnectInterval = d.GossipInterval, d.PushPullInterval, d.ReconnectInterval
	}
	for _, n := range []int{5, 20, 50} {
		t.Run(fmt.Sprintf("write latency %d nodes", n), func(t *testing.T) {
			tc := newTCluster(t, n, lan)
			tc.joinAll()
			rng := rand.New(rand.NewPCG(7, uint64(n)))
			var took []time.Duration
			for i := range 20 {
				t0 := time.Now()
				r := tc.nodes[rng.IntN(n)].publish(t, fmt.Sprintf("test/latency/k%02d", i), "v")
				took = append(took, tc.spread(r, t0, 90*time.Second)) // anti-entropy (30 s) repairs lost deltas
			}
			slices.Sort(took)
			t.Logf("%d nodes, 20 writes: to all nodes median %s, p99 %s (min %s)",
				n, took[len(took)/2].Round(time.Millisecond), took[len(took)*99/100].Round(time.Millisecond), took[0].Round(time.Millisecond))
		})
	}
	for _, records := range []int{0, 1000} {
		t.Run(fmt.Sprintf("idle traffic 20 nodes %d records", records), func(t *testing.T) {
			var preload []crdt.Map
			if records > 0 {
				m := preloadMap(records, "n00", 200)
				for range 20 {
					preload = append(preload, m)
				}
			}
			tc := newTCluster(t, 20, lan, preload...)
			tc.joinAll()
			time.Sleep(5 * time.Second) // let join traffic settle
			sum := func() (total, packets, streams int64) {
				for _, nd := range tc.nodes {
					c := nd.tr.Counters()
					total += c.Total()
					packets += c.PacketBytes
					streams += c.StreamBytes
				}
				return
			}
			t0, p0, s0 := sum()
			time.Sleep(window)
			t1, p1, s1 := sum()
			per := func(b int64) float64 { return float64(b) / window.Seconds() / 20 }
			t.Logf("20 nodes, %d records, idle for %s: %.0f B/s per node sent (UDP %.0f B/s, TCP %.0f B/s)",
				records, window, per(t1-t0), per(p1-p0), per(s1-s0))
		})
	}
}

// TestFiguresSigning measures what record signatures cost (issue 10): a
// 20-node cluster with memberlist's LAN defaults on loopback, idle and
// under 100 writes/s of status-sized records (300-byte values, each from
// a random node; base64 of random bytes), once unsigned and once signed
// (Ed25519, crdt.Sign) with
// every receiver verifying each record it is offered (an Accept hook
// calling crdt.VerifySignature, as the node's does). It reports gossip
// bytes per node per second and the process's CPU time per node (user +
// system, divided by 20) as a share of one core. Runs with GOSSIP_FIGURES=1:
//
//	GOSSIP_FIGURES=1 go test ./gossip/ -run TestFiguresSigning -v -timeout 20m
func TestFiguresSigning(t *testing.T) {
	if os.Getenv("GOSSIP_FIGURES") == "" {
		t.Skip("set GOSSIP_FIGURES=1 to measure")
	}
	window := 30 * time.Second
	if w, err := time.ParseDuration(os.Getenv("GOSSIP_FIGURES_WINDOW")); err == nil {
		window = w
	}
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	// A 300-byte value that compresses like real records do not compress
	// better (memberlist compresses gossip packets with LZW): base64 of
	// random bytes. A run of one letter would compress to almost nothing
	// and make the signature look like most of the traffic.
	raw := make([]byte, 222)
	rand.NewChaCha8([32]byte{1}).Read(raw)
	value := `"` + base64.StdEncoding.EncodeToString(raw) + `"`
	for _, signed := range []bool{false, true} {
		for _, rate := range []int{0, 100} {
			t.Run(fmt.Sprintf("signed=%v %d writes/s", signed, rate), func(t *testing.T) {
				var verified atomic.Int64
				tc := newTCluster(t, 20, func(_ int, cfg *Config) {
					d := DefaultConfig()
					cfg.ProbeInterval, cfg.ProbeTimeout, cfg.SuspicionMult = d.ProbeInterval, d.ProbeTimeout, d.SuspicionMult
					cfg.GossipInterval, cfg.PushPullInterval, cfg.ReconnectInterval = d.GossipInterval, d.PushPullInterval, d.ReconnectInterval
					if signed {
						cfg.Accept = func(r crdt.Record) error {
							verified.Add(1)
							if !crdt.VerifySignature(r) {
								return errors.New("bad signature")
							}
							return nil
						}
					}
				})
				tc.joinAll()
				time.Sleep(5 * time.Second)
				bytes := func() (total, stream int64) {
					for _, nd := range tc.nodes {
						total += nd.tr.Counters().Total()
						stream += nd.tr.Counters().StreamBytes
					}
					return
				}
				cpu := func() time.Duration {
					var ru syscall.Rusage
					syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
					return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
				}
				b0, s0 := bytes()
				c0 := cpu()
				stop := time.Now().Add(window)
				rng := rand.New(rand.NewPCG(1, 2))
				writes := 0
				if rate > 0 {
					tick := time.NewTicker(time.Second / time.Duration(rate))
					for time.Now().Before(stop) {
						<-tick.C
						nd := tc.nodes[rng.IntN(len(tc.nodes))]
						r := crdt.Record{Key: fmt.Sprintf("node/cluster/w%03d", writes%200), Value: []byte(value), Version: nd.clock.Now(), Origin: nd.name}
						if signed {
							if r, err = crdt.Sign(r, key); err != nil {
								t.Fatal(err)
							}
						}
						if err := nd.c.Publish(r); err != nil {
							t.Fatal(err)
						}
						writes++
					}
					tick.Stop()
				} else {
					time.Sleep(window)
				}
				b1, s1 := bytes()
				c1 := cpu()
				per := float64(b1-b0) / window.Seconds() / 20
				perTCP := float64(s1-s0) / window.Seconds() / 20
				core := float64(c1-c0) / float64(window) / 20 * 100
				t.Logf("20 nodes, signed=%v, %d writes in %s: %.0f B/s per node sent (TCP %.0f B/s), CPU %.2f%% of a core per node; %d signatures verified",
					signed, writes, window, per, perTCP, core, verified.Load())
			})
		}
	}
}
