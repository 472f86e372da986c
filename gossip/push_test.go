package gossip

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// A burst of writes (a manifest of many objects, the revisions a
// Deployment's deletion tombstones) costs its writer a few direct
// connections, not directPeers per write, and every write still reaches
// every node. Before the writes were coalesced, 200 writes opened 600.
func TestBurstOfWritesCostsAFewDirectSends(t *testing.T) {
	const writes = 200
	tc := newTCluster(t, 6, nil)
	tc.joinAll()
	w := tc.nodes[0]
	before := w.c.directSends.Load()
	for i := range writes {
		w.publish(t, fmt.Sprintf("test/burst/r%03d", i), "v")
	}
	if m := tc.waitConverged(20 * time.Second); len(m) != writes {
		t.Fatalf("converged on %d records, want %d", len(m), writes)
	}
	sent := w.c.directSends.Load() - before
	t.Logf("%d writes: %d direct messages", writes, sent)
	if sent < directPeers || sent > writes/4 {
		t.Fatalf("%d writes sent %d direct messages, want %d to %d", writes, sent, directPeers, writes/4)
	}
}

// A push's records are gossiped on by the member that receives it, as a
// delta is (the writer's own gossip may wait behind memberlist's
// messages); a records message's (anti-entropy, pulls) are not.
func TestPushedWritesAreGossipedOn(t *testing.T) {
	newC := func() *Cluster {
		cfg := DefaultConfig()
		cfg.Name = "n99"
		cfg.Logger = testLogger()
		c, err := newCluster(cfg, NewMemState())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Large enough to compress, small enough for a delta.
	r := crdt.Record{Key: "test/ns/a", Value: []byte(jsonString(700)), Version: hlc.Timestamp{Wall: 5}, Origin: "n00"}
	enc, err := crdt.EncodeRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	records := encodeRecords([][]byte{enc})[0]
	for _, tt := range []struct {
		name string
		msg  []byte
		want int
	}{
		{"push", encodePush(records), 1},
		{"push, compressed", encodePush(forceCompressed(t, records)), 1},
		{"records", records, 0},
	} {
		c := newC()
		(&delegate{c}).NotifyMsg(tt.msg)
		if _, ok, _ := c.state.Get(r.Key); !ok {
			t.Errorf("%s: record not applied", tt.name)
		}
		if n := c.queue.NumQueued(); n != tt.want {
			t.Errorf("%s: %d deltas queued to gossip on, want %d", tt.name, n, tt.want)
		}
	}
}

// A writer reaches readers of each version by direct sends alone (4
// members, so every other member is a direct peer; no gossip of deltas
// or announcements, no anti-entropy): members that read push messages,
// members of compressed records only (before push messages) and members
// of version 0, with a burst of small writes and a large one from each
// of three writers.
func TestDirectSendsReachEveryWireVersion(t *testing.T) {
	tc := newTCluster(t, 4, func(i int, cfg *Config) {
		cfg.PushPullInterval = time.Hour
		cfg.DigestInterval = time.Hour
		cfg.noGossip = true
		cfg.wireV0 = i%3 == 1
		cfg.noPush = i%3 == 2
	})
	tc.joinAll()
	for i, nd := range tc.nodes[:3] {
		for j := range 20 {
			nd.publish(t, fmt.Sprintf("test/small/%d-%02d", i, j), "v")
		}
		big := nd.record(fmt.Sprintf("test/big/from-%d", i), "")
		big.Value = []byte(jsonString(8 << 10))
		if err := nd.c.Publish(big); err != nil {
			t.Fatal(err)
		}
	}
	if m := tc.waitConverged(5 * time.Second); len(m) != 63 {
		t.Fatalf("converged on %d records, want 63", len(m))
	}
}

func TestDecodePushRejects(t *testing.T) {
	for _, tt := range []struct {
		name string
		b    []byte
	}{
		{"empty", []byte{byte(msgPush)}},
		{"a delta inside", encodePush(encodeDelta([]byte{1}))},
		{"a push inside", encodePush(encodePush(encodeRecords([][]byte{{1}})[0]))},
		{"bad compressed block", encodePush([]byte{byte(msgRecordsZ), 0xff, 0xff})},
		{"another type", []byte{byte(msgRecords)}},
	} {
		if _, err := decodePush(tt.b); err == nil {
			t.Errorf("%s: accepted %x", tt.name, tt.b)
		}
	}
}

// forceCompressed returns records compressed, as a member that reads
// compressed records is sent them.
func forceCompressed(t *testing.T, records []byte) []byte {
	z := forPeer(&memberlist.Node{DMax: protoPush}, records)
	if msgType(z[0]) != msgRecordsZ {
		t.Fatalf("%d bytes of records were not compressed", len(records))
	}
	return z
}
