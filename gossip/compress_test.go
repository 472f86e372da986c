package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/klauspost/compress/s2"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// statusLike is a records message of one JSON record shaped like a node
// status listing n replicas.
func statusLike(n int) []byte {
	var v bytes.Buffer
	v.WriteString(`{"name":"n0013","replicas":[`)
	for i := range n {
		fmt.Fprintf(&v, `{"name":"web-7b73914a-%d","namespace":"default","workload":"web","ordinal":%d,"node":"n0013","phase":"Running","ready":true,"podIP":"10.22.17.%d","specHash":"61d08239"},`, i, i, i+2)
	}
	v.WriteString(`{}]}`)
	enc, _ := crdt.EncodeRecord(crdt.Record{Key: "node/cluster/n0013", Value: v.Bytes(), Version: hlc.Timestamp{Wall: 5}, Origin: "n0013"})
	return encodeRecords([][]byte{enc})[0]
}

// A peer that reads compressed records gets them compressed, and they
// decode to the same message; an older peer (DMax 0) and a small message
// go as they are.
func TestRecordsCompressForPeersThatReadThem(t *testing.T) {
	msg := statusLike(10)
	z := forPeer(&memberlist.Node{DMax: protoS2}, msg)
	if msgType(z[0]) != msgRecordsZ || len(z)*3 > len(msg) {
		t.Fatalf("a %d-byte status went as type %v, %d bytes; want compressed to a third or less", len(msg), msgType(z[0]), len(z))
	}
	t.Logf("records message of a status with 10 replicas: %d -> %d bytes", len(msg), len(z))
	back, err := decodeRecordsZ(z)
	if err != nil || !bytes.Equal(back, msg) {
		t.Fatalf("decodeRecordsZ = %d bytes, %v; want the message back", len(back), err)
	}
	if got := forPeer(&memberlist.Node{DMax: 0}, msg); !bytes.Equal(got, msg) {
		t.Fatalf("a peer of delegate version 0 was sent type %v", msgType(got[0]))
	}
	small := encodeRecords([][]byte{msg[3:40]})[0]
	if got := forPeer(&memberlist.Node{DMax: protoS2}, small); !bytes.Equal(got, small) {
		t.Fatalf("a %d-byte message was compressed", len(small))
	}
}

// Compressed input is untrusted like any other: a block that would
// expand past memberlist's stream limit, one whose header lies about its
// size, one holding something other than a records message, or garbage
// is refused with errMalformed.
func TestRecordsCompressedRefusesHostileBlocks(t *testing.T) {
	z := func(b []byte) []byte { return append([]byte{byte(msgRecordsZ)}, s2.Encode(nil, b)...) }
	bomb := append([]byte{byte(msgRecords)}, make([]byte, maxMessageLen)...)
	liar := z(statusLike(3))
	liar[1]++ // the uvarint decoded length, one more
	cases := map[string][]byte{
		"expands past maxDecodedLen": z(bomb),
		"expands over maxRatio":      z(append([]byte{byte(msgRecords)}, make([]byte, 1<<20)...)),
		"lies about its size":        liar,
		"holds a pull":               z(encodePull(pull{From: "n00", Keys: []string{"a/b/c"}})),
		"holds nothing":              z(nil),
		"garbage":                    {byte(msgRecordsZ), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"empty":                      {byte(msgRecordsZ)},
	}
	for name, b := range cases {
		_, err := decodeRecordsZ(b)
		if !errors.Is(err, errMalformed) {
			t.Errorf("%s: decodeRecordsZ = %v, want errMalformed", name, err)
		}
		t.Logf("%s (%d bytes): %v", name, len(b), err)
	}
}

func FuzzDecodeRecordsZ(f *testing.F) {
	f.Add(forPeer(&memberlist.Node{DMax: protoS2}, statusLike(10)))
	f.Add([]byte{byte(msgRecordsZ), 0x80, 0x80, 0x80, 0x0a})
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		inner, err := decodeRecordsZ(b)
		if err != nil {
			return
		}
		if len(inner) > maxMessageLen {
			t.Fatalf("decoded %d bytes, over maxMessageLen", len(inner))
		}
		decodeRecords(inner) // must not panic
	})
}

// In a cluster where some nodes are of the earlier wire (delegate version
// 0, which drop compressed records as an unknown message), large records
// still reach every node, by every path: a writer's direct sends, pulls
// of announcements and anti-entropy; the others exchange them compressed.
func TestMixedWireVersionsConverge(t *testing.T) {
	old := func(i int, cfg *Config) { cfg.wireV0 = i%2 == 1 }
	tc := newTCluster(t, 4, old, preloadMap(50, "n00", 3000))
	tc.joinAll()
	for _, i := range []int{0, 1, 2} {
		r := tc.nodes[i].record(fmt.Sprintf("test/big/from-%d", i), "")
		r.Value = []byte(jsonString(8 << 10))
		if err := tc.nodes[i].c.Publish(r); err != nil {
			t.Fatal(err)
		}
	}
	if m := tc.waitConverged(30 * time.Second); len(m) != 53 {
		t.Fatalf("converged on %d records, want 53", len(m))
	}
}

// A member's delegate protocol maximum follows its alive messages: one
// that restarts on an earlier version (a rollback, before peers declared
// it dead) is sent plain records again.
func TestAliveMessageUpdatesWhatAMemberReads(t *testing.T) {
	tc := newTCluster(t, 2, nil)
	tc.joinAll()
	c := tc.nodes[0].c
	if p, ok := c.peer("n01"); !ok || p.DMax != protoPush {
		t.Fatalf("n01 reads delegate version %v (known %v), want %d", p, ok, protoPush)
	}
	(&delegate{c: c}).NotifyAlive(&memberlist.Node{Name: "n01", DMax: 0})
	if p, _ := c.peer("n01"); p.DMax != 0 {
		t.Fatalf("after an alive message of version 0, n01 reads %d", p.DMax)
	}
	if msg := statusLike(10); !bytes.Equal(forPeer(mustPeer(t, c, "n01"), msg), msg) {
		t.Fatal("n01, now of version 0, is sent compressed records")
	}
}

func mustPeer(t *testing.T, c *Cluster, name string) *memberlist.Node {
	p, ok := c.peer(name)
	if !ok {
		t.Fatalf("%s is not a live peer", name)
	}
	return p
}
