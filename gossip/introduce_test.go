package gossip

import (
	"testing"
	"time"
)

// Introduce pushes/pulls with a live member, at most once per
// IntroduceGap whatever the names asked about, and never for this node,
// a member it holds up, with no live peer, or after Shutdown. (That the
// push/pull teaches a node a member it missed: node's
// TestAMemberMissedByGossipIsLearnedFromItsRecord.)
func TestIntroduceIsBoundedAndNeedsALivePeer(t *testing.T) {
	tc := newTCluster(t, 3, nil)
	lone := tc.nodes[2].c
	if lone.Introduce("ghost") {
		t.Fatal("a node with no live peer started an introduction")
	}
	if _, err := tc.nodes[1].c.Join([]string{tc.nodes[0].tr.Addr()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		return tc.nodes[0].c.NumMembers() == 2 && tc.nodes[1].c.NumMembers() == 2, "n00 and n01 do not see each other"
	})
	c := tc.nodes[1].c
	for _, name := range []string{"n01", "n00"} {
		if c.Introduce(name) {
			t.Fatalf("Introduce(%s) of this node or a live member started a push/pull", name)
		}
	}
	if !c.Introduce("ghost") {
		t.Fatal("Introduce of a name never heard of started no push/pull")
	}
	for _, name := range []string{"ghost", "other"} {
		if c.Introduce(name) {
			t.Fatalf("Introduce(%s) within IntroduceGap of the last started another push/pull", name)
		}
	}
	if got := c.introductions.Load(); got != 1 {
		t.Fatalf("%d introductions, want 1", got)
	}
	tc.nodes[1].shutdown(t)
	c.introMu.Lock()
	c.introduced = time.Time{}
	c.introMu.Unlock()
	if c.Introduce("ghost") {
		t.Fatal("Introduce after Shutdown started a push/pull")
	}
}
