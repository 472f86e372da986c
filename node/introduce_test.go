package node

import (
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/testnet"
	"github.com/starling-orchestrator/starling/node/store"
)

// A node that missed a member's join (every alive message about it lost,
// as at 300 simulated nodes, where one node saw 299 members for 2 m 46 s)
// learns of it from the member's record within seconds, not at its next
// periodic push/pull with a node that knows the member (30 s here, 180 s
// at 1,000 nodes), which this test never lets happen.
func TestAMemberMissedByGossipIsLearnedFromItsRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &simCluster{t: t, mem: testnet.NewMem(time.Millisecond), pool: store.NewPool()}
		defer c.stopAll()
		add := func(name string, join []string) *simNode {
			nd := &simNode{name: name, rt: newFakeRuntime(), store: store.NewMemoryPooled(c.pool)}
			c.startNode(nd, join)
			c.nodes = append(c.nodes, nd)
			return nd
		}
		seed := add("i0", nil)
		x := add("i1", []string{seed.tr.Addr()})
		if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool { return x.agent.cluster.NumMembers() == 2 }); !ok {
			t.Fatal("i1 did not join i0")
		}
		// i1 hears no alive message from now on, and no push/pull but
		// those it dials to i2.
		c.mem.Strip("i1", 4)
		c.mem.CutStreams("i0", "i1")
		c.mem.CutStreams("i1", "i0")
		c.mem.CutStreams("i2", "i1")
		m := add("i2", []string{seed.tr.Addr()})
		if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool {
			_, held := x.agent.views.view().statuses["i2"]
			return held && seed.agent.cluster.NumMembers() == 3
		}); !ok {
			t.Fatal("i1 never got i2's record, or i0 never saw i2 join")
		}
		if st, known := x.agent.cluster.State("i2"); known {
			t.Fatalf("i1 holds i2 %s before anything could tell it: the test lets alive messages through", st)
		}
		took, ok := wait(time.Minute, 100*time.Millisecond, func() bool {
			st, _ := x.agent.cluster.State("i2")
			return st == gossip.StateAlive
		})
		if !ok || took > 2*introduceEvery+time.Second {
			t.Fatalf("i1 learned of i2 after %v (learned: %v), want within %v of holding its record", took, ok, 2*introduceEvery+time.Second)
		}
		t.Logf("i1 learned of i2 %v after holding its record", took)
		if st, _ := m.agent.cluster.State("i1"); st != gossip.StateAlive {
			t.Fatalf("i2 holds i1 %s", st)
		}
	})
}

func TestUnheardOfNamesRecentNodesMembershipNeverListed(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	members := []gossip.Member{{Name: "a"}, {Name: "dead", State: gossip.StateDead}, {Name: "self"}}
	statuses := map[string]NodeStatus{
		"a":        {Name: "a", Advertise: "10.0.0.1:7946", Started: now},
		"dead":     {Name: "dead", Advertise: "10.0.0.2:7946", Started: now},
		"self":     {Name: "self", Advertise: "10.0.0.3:7946", Started: now},
		"missed":   {Name: "missed", Advertise: "10.0.0.4:7946", Started: now.Add(-time.Minute)},
		"old":      {Name: "old", Advertise: "10.0.0.5:7946", Started: now.Add(-introduceWindow - time.Second)},
		"ip-only":  {Name: "ip-only", Advertise: "10.0.0.6", Started: now},
		"unstated": {Name: "unstated", Advertise: "10.0.0.7:7946"},
	}
	got := unheardOf(members, statuses, "self", now)
	if len(got) != 1 || got["missed"] != netip.MustParseAddrPort("10.0.0.4:7946") {
		t.Fatalf("unheardOf = %v, want only missed at 10.0.0.4:7946", got)
	}
}
