package node

import (
	"crypto/ed25519"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/member"
	"github.com/starling-orchestrator/starling/node/store"
	"github.com/starling-orchestrator/starling/node/view"
)

// TestMemberMetaSignatureBindsNameAddressAndRun: version 3 metadata
// verifies only with the signer's key, for the name and address signed;
// any other key, name, address, port or flipped bit fails, and earlier
// versions read as unsigned. An agent that reads version 2 reads the
// first 17 bytes of version 3 as before.
func TestMemberMetaSignatureBindsNameAddressAndRun(t *testing.T) {
	m := member.Meta{Since: 1_700_000_000_000_000_000, Started: 1_700_000_100_000_000_000}
	addr := netip.MustParseAddrPort("192.168.250.23:7946")
	meta := member.SignMeta(m, "n3", addr, keyOf("n3"))
	if len(meta) != member.MetaV3Len {
		t.Fatalf("version 3 metadata is %d bytes, want %d", len(meta), member.MetaV3Len)
	}
	if got, err := member.VerifyMeta("n3", addr, meta, keyOf("n3").Public().(ed25519.PublicKey)); err != nil || got != m {
		t.Fatalf("verify: %+v %v", got, err)
	}
	if got, ok := member.DecodeMeta(meta); !ok || got != m {
		t.Fatalf("a version 2 reader reads %+v %v", got, ok)
	}
	mapped := netip.AddrPortFrom(netip.AddrFrom16(addr.Addr().As16()), addr.Port())
	if _, err := member.VerifyMeta("n3", mapped, meta, keyOf("n3").Public().(ed25519.PublicKey)); err != nil {
		t.Fatalf("the IPv4-mapped form of the address: %v", err)
	}
	flipped := append([]byte(nil), meta...)
	flipped[5] ^= 1
	pub := keyOf("n3").Public().(ed25519.PublicKey)
	for name, c := range map[string]struct {
		name string
		addr netip.AddrPort
		meta []byte
		key  ed25519.PublicKey
		want error
	}{
		"another key":         {"n3", addr, meta, keyOf("evil").Public().(ed25519.PublicKey), member.ErrSignature},
		"another name":        {"n2", addr, meta, pub, member.ErrSignature},
		"another address":     {"n3", netip.MustParseAddrPort("192.168.250.52:7946"), meta, pub, member.ErrSignature},
		"another port":        {"n3", netip.MustParseAddrPort("192.168.250.23:7947"), meta, pub, member.ErrSignature},
		"a flipped bit":       {"n3", addr, flipped, pub, member.ErrSignature},
		"cut short":           {"n3", addr, meta[:member.MetaV3Len-1], pub, member.ErrSignature},
		"version 2":           {"n3", addr, member.EncodeMeta(m), pub, member.ErrUnsigned},
		"none":                {"n3", addr, nil, pub, member.ErrUnsigned},
		"not a key":           {"n3", addr, meta, pub[:5], member.ErrSignature},
		"version 2 + 64 junk": {"n3", addr, append(member.EncodeMeta(m), meta[17:]...), pub, member.ErrUnsigned},
	} {
		if _, err := member.VerifyMeta(c.name, c.addr, c.meta, c.key); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

// authWith returns the memberAuth of node "n1" (run started at started)
// over a store holding the status records of recs (name -> status,
// signed by signer's key).
func authWith(t *testing.T, started time.Time, statuses map[string]view.NodeStatus, signer map[string]string) (*memberAuth, *prometheus.CounterVec) {
	t.Helper()
	st := store.NewMemory()
	for name, s := range statuses {
		r := statusRecord(t, s, name)
		r.Version = hlc.Timestamp{Wall: time.Now().UnixNano()}
		if _, err := st.Apply(signAs(t, signer[name], r)); err != nil {
			t.Fatal(err)
		}
	}
	count := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "m"}, []string{"reason"})
	return newMemberAuth("n1", keyOf("n1"), 1, started.UnixNano(), st, slog.New(slog.NewTextHandler(io.Discard, nil)), count), count
}

// TestMemberAuthTakesOnlyWhatTheNamesKeySigned: an alive message for a
// name whose certified status record says it signs is taken only with
// metadata the record's key signed for the message's address, and of a
// run no older than the one held; an impostor's own key, a replay of
// the real node's metadata from another address, unsigned metadata and
// an earlier run are refused and counted by reason. A name bound by an
// agent that predates signing, or not bound yet, is taken as before.
func TestMemberAuthTakesOnlyWhatTheNamesKeySigned(t *testing.T) {
	now := time.Now()
	run := now.Add(-time.Minute).Truncate(time.Second)
	n2 := view.NodeStatus{Name: "n2", Started: run, MemberSig: true}
	old := view.NodeStatus{Name: "old", Started: run}
	ma, count := authWith(t, now, map[string]view.NodeStatus{"n2": n2, "old": old}, map[string]string{"n2": "n2", "old": "old"})
	home := netip.MustParseAddrPort("192.168.250.22:7946")
	evil := netip.MustParseAddrPort("192.168.250.52:7946")
	thisRun := member.Meta{Since: 1, Started: run.Add(time.Second).UnixNano()}
	good := member.SignMeta(thisRun, "n2", home, keyOf("n2"))
	cases := []struct {
		name   string
		a      gossip.Alive
		reason string // "" when taken
	}{
		{"the node itself", gossip.Alive{Name: "n2", Addr: home, Meta: good}, ""},
		{"the node at a new address it signed", gossip.Alive{Name: "n2", Addr: evil, Meta: member.SignMeta(thisRun, "n2", evil, keyOf("n2"))}, ""},
		{"an impostor with a key of its own", gossip.Alive{Name: "n2", Addr: evil, Meta: member.SignMeta(thisRun, "n2", evil, keyOf("evil"))}, memberSignature},
		{"a replay from another address", gossip.Alive{Name: "n2", Addr: evil, Meta: good}, memberSignature},
		{"unsigned", gossip.Alive{Name: "n2", Addr: evil, Meta: member.EncodeMeta(thisRun)}, memberUnsigned},
		{"no metadata", gossip.Alive{Name: "n2", Addr: evil}, memberUnsigned},
		{"a run before the held record's", gossip.Alive{Name: "n2", Addr: evil,
			Meta: member.SignMeta(member.Meta{Since: 1, Started: run.Add(-time.Hour).UnixNano()}, "n2", evil, keyOf("n2"))}, memberEarlierRun},
		{"a run before the held metadata's", gossip.Alive{Name: "n2", Addr: evil,
			Meta:     member.SignMeta(thisRun, "n2", evil, keyOf("n2")),
			HeldAddr: home, HeldMeta: member.SignMeta(member.Meta{Since: 1, Started: thisRun.Started + 1}, "n2", home, keyOf("n2"))}, memberEarlierRun},
		{"held metadata nobody signed does not count", gossip.Alive{Name: "n2", Addr: home, Meta: good,
			HeldAddr: evil, HeldMeta: member.SignMeta(member.Meta{Since: 1, Started: thisRun.Started + 1}, "n2", evil, keyOf("evil"))}, ""},
		{"an agent that predates signing", gossip.Alive{Name: "old", Addr: evil, Meta: member.EncodeMeta(thisRun)}, ""},
		{"a name no record binds", gossip.Alive{Name: "new", Addr: evil, Meta: member.EncodeMeta(thisRun)}, ""},
	}
	for _, c := range cases {
		before := testutil.ToFloat64(count.WithLabelValues(c.reason))
		err := ma.check(c.a)
		if (err == nil) != (c.reason == "") {
			t.Errorf("%s: %v, want refused: %v", c.name, err, c.reason != "")
			continue
		}
		if c.reason != "" && testutil.ToFloat64(count.WithLabelValues(c.reason)) != before+1 {
			t.Errorf("%s: not counted as %s", c.name, c.reason)
		}
	}
}

// TestMemberAuthOwnEarlierRunAtAnOldAddress: this node, back at a new
// address, refuses its own earlier run's alive message for its old one
// (taken, memberlist would read it as another node using the name) and
// passes anything else about itself to memberlist.
func TestMemberAuthOwnEarlierRunAtAnOldAddress(t *testing.T) {
	now := time.Now()
	ma, _ := authWith(t, now, nil, nil)
	here := netip.MustParseAddrPort("192.168.250.33:7946")
	was := netip.MustParseAddrPort("192.168.250.23:7946")
	ma.sign(here)
	earlier := member.SignMeta(member.Meta{Since: 1, Started: now.Add(-time.Minute).UnixNano()}, "n1", was, keyOf("n1"))
	if err := ma.check(gossip.Alive{Name: "n1", Addr: was, Meta: earlier}); !errors.Is(err, errEarlierRun) {
		t.Errorf("own earlier run at the old address: %v", err)
	}
	for name, a := range map[string]gossip.Alive{
		"own earlier run at this address": {Name: "n1", Addr: here, Meta: member.SignMeta(member.Meta{Since: 1, Started: now.Add(-time.Minute).UnixNano()}, "n1", here, keyOf("n1"))},
		"another key under this name":     {Name: "n1", Addr: was, Meta: member.SignMeta(member.Meta{Since: 1, Started: 1}, "n1", was, keyOf("evil"))},
	} {
		if err := ma.check(a); err != nil {
			t.Errorf("%s: %v, want it passed to memberlist", name, err)
		}
	}
}

// TestRoutesGoOnlyToSignedAddresses: a route to a peer's subnet goes via
// the address membership holds for it only if its status record's key
// signed that address; an agent that predates signing is routed as before.
func TestRoutesGoOnlyToSignedAddresses(t *testing.T) {
	ma, _ := authWith(t, time.Now(), nil, nil)
	addr := netip.MustParseAddrPort("192.168.250.22:7946")
	s := view.NodeStatus{Name: "n2", MemberSig: true, Signer: keyOf("n2").Public().(ed25519.PublicKey)}
	meta := member.SignMeta(member.Meta{Since: 1, Started: 2}, "n2", addr, keyOf("n2"))
	m := gossip.Member{Name: "n2", Addr: "192.168.250.22", Port: 7946, Meta: meta}
	if !ma.SignedAddr(m, s) {
		t.Fatal("the node's own signed address is not routed")
	}
	m.Addr = "192.168.250.52"
	if ma.SignedAddr(m, s) {
		t.Fatal("an address the node did not sign is routed")
	}
	m.Meta = member.SignMeta(member.Meta{Since: 1, Started: 2}, "n2", netip.MustParseAddrPort("192.168.250.52:7946"), keyOf("evil"))
	if ma.SignedAddr(m, s) {
		t.Fatal("an address another key signed is routed")
	}
	s.MemberSig = false
	if !ma.SignedAddr(m, s) {
		t.Fatal("a node that predates signing is not routed")
	}
}

// BenchmarkCheckAlive measures the check of one alive message for a
// bound name: the first sight of a (name, address, metadata) and a
// repeat (memberlist's push/pulls repeat every member's).
func BenchmarkCheckAlive(b *testing.B) {
	t := &testing.T{}
	now := time.Now()
	ma, _ := authWith(t, now, map[string]view.NodeStatus{"n2": {Name: "n2", Started: now.Add(-time.Minute), MemberSig: true}}, map[string]string{"n2": "n2"})
	addr := netip.MustParseAddrPort("192.168.250.22:7946")
	a := gossip.Alive{Name: "n2", Addr: addr, Meta: member.SignMeta(member.Meta{Since: 1, Started: now.UnixNano()}, "n2", addr, keyOf("n2"))}
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			clear(ma.verified)
			if err := ma.check(a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("repeat", func(b *testing.B) {
		for b.Loop() {
			if err := ma.check(a); err != nil {
				b.Fatal(err)
			}
		}
	})
}
