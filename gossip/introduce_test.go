package gossip

import (
	"testing"
	"time"
)

// Introduce pushes/pulls with the live member named, at most once per
// IntroduceGap whatever the names asked about, and never for this node,
// a member it holds up, through this node or a member not alive here, or
// after Shutdown. (That the push/pull teaches a node a member it missed:
// node's TestAMemberMissedByGossipIsLearnedFromItsRecord.)
func TestIntroduceIsBoundedAndNeedsALivePeer(t *testing.T) {
	tc := newTCluster(t, 3, nil)
	if tc.nodes[2].c.Introduce("ghost", "n00") {
		t.Fatal("an introduction through a member this node never heard of started")
	}
	if _, err := tc.nodes[1].c.Join([]string{tc.nodes[0].tr.Addr()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		return tc.nodes[0].c.NumMembers() == 2 && tc.nodes[1].c.NumMembers() == 2, "n00 and n01 do not see each other"
	})
	c := tc.nodes[1].c
	for _, q := range [][2]string{{"n01", "n00"}, {"n00", "n00"}, {"ghost", "n01"}, {"ghost", "n02"}} {
		if c.Introduce(q[0], q[1]) {
			t.Fatalf("Introduce(%s, via %s) started a push/pull", q[0], q[1])
		}
	}
	if w := c.IntroduceWait(); w != 0 {
		t.Fatalf("IntroduceWait before any introduction = %v", w)
	}
	if !c.Introduce("ghost", "n00") {
		t.Fatal("Introduce of a name never heard of, through a live member, started no push/pull")
	}
	for _, name := range []string{"ghost", "other"} {
		if c.Introduce(name, "n00") {
			t.Fatalf("Introduce(%s) within IntroduceGap of the last started another push/pull", name)
		}
	}
	if w := c.IntroduceWait(); w <= 0 || w > IntroduceGap {
		t.Fatalf("IntroduceWait after an introduction = %v, want within IntroduceGap", w)
	}
	if got := c.introductions.Load(); got != 1 {
		t.Fatalf("%d introductions, want 1", got)
	}
	tc.nodes[1].shutdown(t)
	c.introMu.Lock()
	c.introduced = time.Time{}
	c.introMu.Unlock()
	if c.Introduce("ghost", "n00") {
		t.Fatal("Introduce after Shutdown started a push/pull")
	}
}
