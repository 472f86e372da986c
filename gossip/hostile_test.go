package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// garbage returns malformed messages of every type: empty, truncated,
// trailing bytes, absurd counts, invalid records, keys and names.
func garbage() [][]byte {
	valid := validMessages()
	out := [][]byte{
		nil,
		{},
		{0},
		{255},
		{byte(msgDelta)},
		{byte(msgRecords), 0xff, 0xff, 0xff, 0xff, 0x0f},                      // 4 billion records
		{byte(msgRecords), 1, 0xff, 0xff, 0xff, 0xff, 0x0f},                   // one 4 GiB record
		{byte(msgDigest), 3, 'n', '0', '0', 0x80, 0x02},                       // 256 buckets, no hashes
		{byte(msgDigest), 3, 'n', '0', '0', 0x81, 0x00},                       // non-canonical varint
		{byte(msgRequest), 3, 'n', '0', '0', 2, 5, 5, 0},                      // duplicate bucket
		{byte(msgRequest), 3, 'n', '0', '0', 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, // 4 billion entries
		{byte(msgPull), 3, 'n', '0', '0', 1, 3, 'a', '/', 'b'},                // invalid key
		{byte(msgPull), 0},             // empty name
		{byte(msgLeave), 2, 'a', '\n'}, // control character
		bytes.Repeat([]byte{0xff}, 2000),
	}
	bad, _ := crdt.EncodeRecord(crdt.Record{Key: "a/b/c", Value: []byte(`1`), Version: hlc.Timestamp{Wall: 1}, Origin: "o"})
	bad[len(bad)-1] = '!' // value no longer valid JSON
	out = append(out, append([]byte{byte(msgDelta)}, bad...))
	for _, v := range valid {
		for _, cut := range []int{1, len(v) / 2, len(v) - 1} {
			if cut > 0 && cut < len(v) {
				out = append(out, v[:cut])
			}
		}
		out = append(out, append(bytes.Clone(v), 0))
	}
	return out
}

// validMessages returns one well-formed message of each type.
func validMessages() [][]byte {
	r := crdt.Record{Key: "test/ns/a", Value: []byte(`{"x":1}`), Version: hlc.Timestamp{Wall: 5, Logical: 1}, Origin: "n00"}
	enc, _ := crdt.EncodeRecord(r)
	e := entryOf(r, enc)
	var d digest
	d.From = "n00"
	d.Buckets[3] = 42
	return [][]byte{
		encodeDelta(enc),
		encodeRecords([][]byte{enc, enc})[0],
		encodeDigest(d),
		encodeRequest(request{From: "n00", Buckets: []uint8{bucketOf(r.Key)}, Entries: []entry{e}}),
		encodePull(pull{From: "n00", Keys: []string{"test/ns/a", "test/ns/b"}}),
		encodeLeave("n00"),
		encodeHave(have{From: "n00", E: e}),
		encodeQuestion(msgAsk, question{From: "n00", Seq: 7, Payload: []byte{3}}),
		encodeQuestion(msgAnswer, question{From: "n01", Seq: 7, Payload: []byte{1, 0, 1}}),
		encodePush(encodeRecords([][]byte{enc})[0]),
	}
}

// hostileDelegate makes a raw memberlist node send garbage everywhere our
// delegate listens: gossip broadcasts, push/pull state.
type hostileDelegate struct {
	msgs [][]byte
	next atomic.Int64
}

func (h *hostileDelegate) pick() []byte {
	return h.msgs[int(h.next.Add(1))%len(h.msgs)]
}
func (h *hostileDelegate) NodeMeta(int) []byte { return nil }
func (h *hostileDelegate) NotifyMsg([]byte)    {}
func (h *hostileDelegate) GetBroadcasts(overhead, limit int) [][]byte {
	if m := h.pick(); len(m) > 0 && len(m)+overhead <= limit {
		return [][]byte{m}
	}
	return nil
}
func (h *hostileDelegate) LocalState(bool) []byte {
	if m := h.pick(); len(m) > 0 {
		return m
	}
	return []byte{byte(msgDigest)}
}
func (h *hostileDelegate) MergeRemoteState([]byte, bool) {}

func TestMalformedMessagesAreDroppedAndNodeKeepsWorking(t *testing.T) {
	tc := newTCluster(t, 2, nil)
	tc.joinAll()
	target := tc.nodes[0]

	// Straight into the delegate, as memberlist would hand them over.
	d := &delegate{target.c}
	for _, g := range garbage() {
		d.NotifyMsg(g)
		d.MergeRemoteState(g, false)
		d.NotifyPingComplete(&memberlist.Node{Name: "n01"}, time.Millisecond, g)
	}

	// Over the network, from a member that speaks memberlist correctly and
	// everything else wrong.
	hd := &hostileDelegate{msgs: garbage()}
	mc := memberlist.DefaultLocalConfig()
	mc.Name = "zz-hostile"
	mc.BindAddr = "127.0.0.1"
	mc.BindPort = 0
	mc.AdvertisePort = 0
	mc.PushPullInterval = 50 * time.Millisecond
	mc.GossipInterval = 10 * time.Millisecond
	mc.Delegate = hd
	mc.Logger = log.New(io.Discard, "", 0)
	hostile, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	defer hostile.Shutdown()
	if _, err := hostile.Join([]string{target.tr.Addr()}); err != nil {
		t.Fatal(err)
	}
	to := &memberlist.Node{Name: target.name}
	host, port := splitAddr(t, target.tr.Addr())
	to.Addr, to.Port = host, port
	for _, g := range garbage() {
		if len(g) == 0 {
			continue
		}
		if err := hostile.SendReliable(to, g); err != nil {
			t.Errorf("SendReliable: %v", err)
		}
		if len(g) < 1000 {
			hostile.SendBestEffort(to, g)
		}
	}
	// Well-formed requests that name a non-member, or ask for keys that do
	// not exist, are harmless too.
	hostile.SendReliable(to, encodePull(pull{From: "nobody", Keys: []string{"a/b/c"}}))
	hostile.SendReliable(to, encodePull(pull{From: "zz-hostile", Keys: []string{"no/such/key"}}))
	hostile.SendReliable(to, encodeRequest(request{From: "nobody", Buckets: []uint8{1}}))
	time.Sleep(500 * time.Millisecond) // several push/pulls and gossip rounds of garbage

	// The node still replicates both ways and sees its peer alive.
	a := tc.nodes[1].publish(t, "test/after/a", "a")
	b := target.publish(t, "test/after/b", "b")
	m := tc.waitConverged(5*time.Second, tc.nodes...)
	if !m[a.Key].Equal(a) || !m[b.Key].Equal(b) || len(m) != 2 {
		t.Fatalf("after garbage: converged on %v", m.Records())
	}
	if got := memberState(target, "n01"); got != StateAlive {
		t.Errorf("n01 is %q after garbage", got)
	}
}

func splitAddr(t *testing.T, addr string) (net.IP, uint16) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	return net.ParseIP(host), uint16(port)
}

// TestSecondNodeWithANameInUseIsRefusedAndDisplacesNothing: a node that
// joins under the name of a live member gets ErrNameTaken from Join, and
// every member keeps the first node's address for the name.
func TestSecondNodeWithANameInUseIsRefusedAndDisplacesNothing(t *testing.T) {
	tc := newTCluster(t, 2, nil)
	tc.joinAll()
	orig := tc.nodes[1].tr.Addr()
	tr, err := tc.net.Transport("impostor")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(tc.nodes[1].name)
	cfg.Transport = tr
	imp, err := New(cfg, NewMemState())
	if err != nil {
		t.Fatal(err)
	}
	defer imp.Shutdown()
	_, err = imp.Join([]string{tc.nodes[0].tr.Addr()})
	if !errors.Is(err, ErrNameTaken) {
		t.Fatalf("Join under a name in use: %v, want ErrNameTaken", err)
	}
	time.Sleep(500 * time.Millisecond) // let the impostor's alive messages spread
	for _, nd := range tc.nodes {
		for _, m := range nd.c.Members() {
			if m.Name == tc.nodes[1].name && (m.State != StateAlive || net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port))) != orig) {
				t.Fatalf("%s sees %s as %s at %s:%d, want alive at %s", nd.name, m.Name, m.State, m.Addr, m.Port, orig)
			}
		}
	}
}

// A member that floods have messages (ever newer versions of one key,
// many keys, versions far in the future, other members' names) cannot
// make a node run unbounded pulls: one worker per key, at most
// maxPendingPulls keys, none for a version the clock would refuse or an
// announcer that is not a member; and the node keeps replicating.
func TestHaveFloodIsBounded(t *testing.T) {
	tc := newTCluster(t, 2, nil)
	tc.joinAll()
	target := tc.nodes[0]
	d := &delegate{target.c}
	before := runtime.NumGoroutine()
	now := time.Now().UnixNano()
	for i := range 5000 {
		e := entry{Key: "test/flood/one", Version: hlc.Timestamp{Wall: now + int64(i)}, Origin: "n01", Hash: uint64(i)}
		d.NotifyMsg(encodeHave(have{From: "n01", E: e}))
		e.Key = fmt.Sprintf("test/flood/k%04d", i)
		d.NotifyMsg(encodeHave(have{From: "n01", E: e}))
		e.Version.Wall = now + int64(2*time.Hour)
		d.NotifyMsg(encodeHave(have{From: "n01", E: e}))
		d.NotifyMsg(encodeHave(have{From: "nobody", E: entry{Key: fmt.Sprintf("test/flood/x%04d", i), Version: hlc.Timestamp{Wall: now}, Origin: "n01"}}))
	}
	target.c.pullMu.Lock()
	pending := len(target.c.pulling)
	target.c.pullMu.Unlock()
	if pending > maxPendingPulls {
		t.Fatalf("%d pulls pending, want at most %d", pending, maxPendingPulls)
	}
	if extra := runtime.NumGoroutine() - before; extra > maxPendingPulls+10 {
		t.Fatalf("%d goroutines more after 20,000 haves, want at most about %d", extra, maxPendingPulls)
	}
	a := tc.nodes[1].publish(t, "test/after/a", "a")
	if m := tc.waitConverged(10*time.Second, tc.nodes...); !m[a.Key].Equal(a) {
		t.Fatalf("after the flood: %v", m[a.Key])
	}
}
