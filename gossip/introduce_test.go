package gossip

import (
	"net/netip"
	"testing"
	"time"
)

// A node that never heard of a member (it missed every copy of the
// member's alive message) learns of it from the push/pull Introduce runs
// with the address the member's records give, and both sides then know
// each other; the same name is not introduced again within
// IntroduceEvery, nor a known member, this node, or an address that is
// no unicast IP and port.
func TestIntroduceJoinsAMemberNeverHeardOf(t *testing.T) {
	tc := newTCluster(t, 3, nil)
	if _, err := tc.nodes[1].c.Join([]string{tc.nodes[0].tr.Addr()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		return tc.nodes[0].c.NumMembers() == 2 && tc.nodes[1].c.NumMembers() == 2, "n00 and n01 do not see each other"
	})
	lone := tc.nodes[2].c
	addr := netip.MustParseAddrPort(tc.nodes[0].tr.Addr())
	for _, bad := range []struct {
		name string
		addr netip.AddrPort
	}{
		{"n02", addr}, // itself
		{"n00", netip.AddrPort{}},
		{"n00", netip.AddrPortFrom(addr.Addr(), 0)},
		{"n00", netip.MustParseAddrPort("0.0.0.0:7946")},
		{"n00", netip.MustParseAddrPort("224.0.0.1:7946")},
	} {
		if lone.Introduce(bad.name, bad.addr) {
			t.Fatalf("Introduce(%q, %v) started a push/pull", bad.name, bad.addr)
		}
	}
	if !lone.Introduce("n00", addr) {
		t.Fatal("Introduce of a member never heard of started no push/pull")
	}
	if lone.Introduce("n00", addr) {
		t.Fatal("the same name was introduced twice within IntroduceEvery")
	}
	tc.waitMembers(3, 10*time.Second)
	if lone.Introduce("n01", netip.MustParseAddrPort(tc.nodes[1].tr.Addr())) {
		t.Fatal("Introduce of a known member started a push/pull")
	}
	if got := lone.introductions.Load(); got != 1 {
		t.Fatalf("%d introductions, want 1", got)
	}
}
