package gossip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

// signedMeta stands for a signature over a member's name and address:
// what SignMeta makes and checkSigned checks (the node layer signs with
// the node key, node/memberauth.go).
func signedMeta(name string, addr netip.AddrPort) []byte {
	return []byte("signed:" + name + "@" + addr.String())
}

// checkSigned is a CheckAlive that takes only signedMeta of the message's
// own name and address.
func checkSigned(a Alive) error {
	if string(a.Meta) != string(signedMeta(a.Name, a.Addr)) {
		return fmt.Errorf("%s at %s: not signed for that address", a.Name, a.Addr)
	}
	return nil
}

// withSigning sets SignMeta and CheckAlive, and failure detection and
// push/pull slow enough that a member back at a new address can only be
// learnt through the moved path, not through a periodic push/pull.
func withSigning(i int, cfg *Config) {
	cfg.SignMeta = func(addr netip.AddrPort) []byte { return signedMeta(cfg.Name, addr) }
	cfg.CheckAlive = checkSigned
	cfg.PushPullInterval = time.Minute
}

func memberAt(n *tnode, name string) (Member, bool) {
	for _, m := range n.c.Members() {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

func addrOf(m Member) string { return net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port))) }

// TestImpostorCannotTakeANameAliveOrDead: with CheckAlive, a program
// that holds the gossip layer (here: no key at all) and joins under a
// member's name, replaying that member's metadata from another address,
// changes no member's address or state on the honest nodes, while the
// member is alive and after it died (when memberlist, with
// DeadNodeReclaimTime set, would otherwise take the name at a new
// address at once); the refusals are counted. The real member, back at
// a new address, is taken.
func TestImpostorCannotTakeANameAliveOrDead(t *testing.T) {
	tc := newTCluster(t, 3, withSigning)
	tc.joinAll()
	victim := tc.nodes[1]
	orig, _ := memberAt(tc.nodes[0], victim.name)
	impostor := func() *Cluster {
		tr, err := tc.net.Transport("impostor")
		if err != nil {
			t.Fatal(err)
		}
		cfg := fastConfig(victim.name)
		cfg.Transport = tr
		cfg.Meta = orig.Meta // the victim's own metadata, replayed
		imp, err := New(cfg, NewMemState())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { imp.Shutdown() })
		imp.Join([]string{tc.nodes[0].tr.Addr(), tc.nodes[2].tr.Addr()})
		return imp
	}
	honest := []*tnode{tc.nodes[0], tc.nodes[2]}
	unchanged := func(want MemberState) {
		t.Helper()
		for _, nd := range honest {
			m, ok := memberAt(nd, victim.name)
			if !ok || m.State != want || addrOf(m) != addrOf(orig) {
				t.Fatalf("%s holds %s as %+v, want %s at %s", nd.name, victim.name, m, want, addrOf(orig))
			}
		}
	}
	imp := impostor()
	time.Sleep(time.Second)
	unchanged(StateAlive)
	victim.shutdown(t)
	eventually(t, 10*time.Second, func() (bool, string) {
		return memberState(tc.nodes[0], victim.name) == StateDead, "victim not dead yet"
	})
	imp.Shutdown()
	impostor() // joins again, now that the name's holder is dead
	time.Sleep(time.Second)
	unchanged(StateDead)
	if tc.nodes[0].c.RefusedAlive() == 0 {
		t.Fatal("no refused alive message counted")
	}
	// The real member, back at a new address.
	back := tc.add(func(i int, cfg *Config) { withSigning(i, cfg); cfg.Name = victim.name }, nil)
	if _, err := back.c.Join([]string{tc.nodes[0].tr.Addr()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() (bool, string) {
		for _, nd := range honest {
			m, _ := memberAt(nd, victim.name)
			if m.State != StateAlive || addrOf(m) != back.tr.Addr() {
				return false, fmt.Sprintf("%s holds %s as %s at %s, want alive at %s", nd.name, victim.name, m.State, addrOf(m), back.tr.Addr())
			}
		}
		return true, ""
	})
}

// TestMemberBackAtANewAddressBeforeItWasFoundDead: a member that crashes
// and comes back at once at a new address (a new DHCP lease) is held up
// at its old address until failure detection finds the old run dead;
// then every member takes the new address at once (Cluster.moved), not
// at the next push/pull (a minute here), and the returning member's own
// Join does not read its old run as another node using its name.
func TestMemberBackAtANewAddressBeforeItWasFoundDead(t *testing.T) {
	tc := newTCluster(t, 3, withSigning)
	tc.joinAll()
	victim := tc.nodes[1]
	victim.shutdown(t)
	back := tc.add(func(i int, cfg *Config) {
		withSigning(i, cfg)
		cfg.Name = victim.name
		// The node layer refuses its own earlier run's alive message
		// (node/memberauth.go checkOwn); here, by address.
		cfg.CheckAlive = func(a Alive) error {
			if a.Name == victim.name && a.Addr.String() == victim.tr.Addr() {
				return errors.New("an earlier run of this node")
			}
			return checkSigned(a)
		}
	}, nil)
	start := time.Now()
	if _, err := back.c.Join([]string{tc.nodes[0].tr.Addr()}); err != nil {
		t.Fatalf("the returning member's Join: %v", err)
	}
	// Each honest member on its own: when it found the old run dead (or
	// took the new address, which it does only after that), and when it
	// took the new address. Members find the old run dead at different
	// times (each probes on its own; suspicion lasts longer on a busy
	// machine), so each is measured from its own finding.
	honest := []*tnode{tc.nodes[0], tc.nodes[2]}
	dead, moved := make([]time.Duration, len(honest)), make([]time.Duration, len(honest))
	eventually(t, 15*time.Second, func() (bool, string) {
		for i, nd := range honest {
			m, _ := memberAt(nd, victim.name)
			atNew := m.State == StateAlive && addrOf(m) == back.tr.Addr()
			if dead[i] == 0 && (m.State == StateDead || atNew) {
				dead[i] = time.Since(start)
			}
			if moved[i] == 0 && atNew {
				moved[i] = time.Since(start)
			}
		}
		for i, nd := range honest {
			if moved[i] == 0 {
				m, _ := memberAt(nd, victim.name)
				return false, fmt.Sprintf("%s holds %s as %s at %s, want alive at %s", nd.name, victim.name, m.State, addrOf(m), back.tr.Addr())
			}
		}
		return true, ""
	})
	for i, nd := range honest {
		t.Logf("%s: the old run found dead %v after the return, the new address taken %v after", nd.name, dead[i], moved[i])
		if moved[i]-dead[i] > 2*time.Second {
			t.Errorf("%s took the new address %v after it found the old run dead, want within 2 s (not at the next push/pull)", nd.name, moved[i]-dead[i])
		}
	}
}
