package gossip

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
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
