package node

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/testnet"
	"github.com/starling-orchestrator/starling/node/store"
)

// A node that missed a member's alive message (every copy lost: at 300
// simulated nodes one node saw 299 members for 2 m 46 s) learns of the
// member from the member's record within seconds: on its join, and on
// its restart after a clean leave, which leaves it held "left" (no
// failure detector looks at it again). memberlist's periodic push/pulls,
// which would repair it in the end (30 s here, 180 s at 1,000 nodes),
// are an hour apart in this test.
func TestAMemberMissedByGossipIsLearnedFromItsRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &simCluster{t: t, mem: testnet.NewMem(time.Millisecond), pool: store.NewPool()}
		defer c.stopAll()
		add := func(name string, join []string) *simNode {
			nd := &simNode{name: name, rt: newFakeRuntime(), store: store.NewMemoryPooled(c.pool)}
			nd.conf = func(cfg *Config) {
				tune := cfg.tuneGossip
				cfg.tuneGossip = func(g *gossip.Config) { tune(g); g.PushPullInterval = time.Hour }
			}
			c.startNode(nd, join)
			c.nodes = append(c.nodes, nd)
			return nd
		}
		seed := add("i0", nil)
		x := add("i1", []string{seed.tr.Addr()})
		if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool { return x.agent.cluster.NumMembers() == 2 }); !ok {
			t.Fatal("i1 did not join i0")
		}
		c.mem.Strip("i1", 4) // i1 hears no alive message from now on
		m := add("i2", []string{seed.tr.Addr()})
		learns := func(what string) {
			t.Helper()
			if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool {
				s := x.agent.views.view().statuses["i2"]
				return s.Started.Equal(m.agent.status.started.UTC().Truncate(time.Second)) && seed.agent.cluster.NumMembers() == 3
			}); !ok {
				t.Fatalf("%s: i1 never got i2's record of this run, or i0 never saw i2", what)
			}
			if st, _ := x.agent.cluster.State("i2"); st.Up() {
				t.Fatalf("%s: i1 holds i2 %s before anything could tell it: the test lets alive messages through", what, st)
			}
			took, ok := wait(2*time.Minute, 100*time.Millisecond, func() bool {
				st, _ := x.agent.cluster.State("i2")
				return st == gossip.StateAlive
			})
			if limit := 2*introduceEvery + time.Second; !ok || took > limit {
				t.Fatalf("%s: i1 learned of i2 after %v (learned: %v), want within %v of holding its record", what, took, ok, limit)
			}
			t.Logf("%s: i1 learned of i2 %v after holding its record", what, took)
		}
		learns("join")
		// A clean stop: i2 leaves, and every node holds it "left".
		m.cancel()
		m.wg.Wait()
		m.agent.stop()
		m.agent.replicas.wg.Wait()
		m.agent.cluster.Shutdown()
		m.tr.Shutdown()
		if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool {
			st, _ := x.agent.cluster.State("i2")
			return st == gossip.StateLeft
		}); !ok {
			t.Fatal("i1 does not hold i2 left")
		}
		time.Sleep(gossip.IntroduceGap)
		// A restarted node joins its seeds and the peers it saw last
		// (members.targets): not i1, which would learn of it then.
		c.mem.CutStreams("i2", "i1")
		c.startNode(m, []string{seed.tr.Addr()})
		learns("restart after a leave")
	})
}

func TestMissedMembersAreRecentNodesMembershipDoesNotHoldUp(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	members := []gossip.Member{
		{Name: "a", State: gossip.StateAlive},
		{Name: "crashed", State: gossip.StateDead, Since: now.Add(-time.Second)},
		{Name: "left-restarted", State: gossip.StateLeft, Since: now.Add(-time.Minute)},
		{Name: "self", State: gossip.StateAlive},
		{Name: "suspect", State: gossip.StateSuspect},
	}
	statuses := map[string]NodeStatus{
		"a":              {Name: "a", Started: now},
		"crashed":        {Name: "crashed", Started: now.Add(-time.Minute)},
		"left-restarted": {Name: "left-restarted", Started: now.Add(-time.Second)},
		"self":           {Name: "self", Started: now},
		"suspect":        {Name: "suspect", Started: now},
		"never-heard":    {Name: "never-heard", Started: now.Add(-time.Minute)},
		"old":            {Name: "old", Started: now.Add(-introduceWindow - time.Second)},
		"future":         {Name: "future", Started: now.Add(introduceSkew + time.Second)},
		"unstated":       {Name: "unstated"},
	}
	got := missedMembers(members, statuses, "self", now)
	if want := []string{"left-restarted", "never-heard"}; !slices.Equal(got, want) {
		t.Fatalf("missedMembers = %v, want %v", got, want)
	}
}
