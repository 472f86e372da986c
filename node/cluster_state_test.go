package node

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/testnet"
	"github.com/starling-orchestrator/starling/node/manifest"
)

func TestRestartFromDiskRejoinsWithoutSeed(t *testing.T) {
	nodes := startCluster(t, 3)
	deploy(t, nodes[0], "keep", 3, "img:v1")
	waitFor(t, 15*time.Second, func() error { return runningEverywhere(nodes, "keep", 3) })
	// Stop the seed and a2; restart a2 with no --join: it rejoins a1
	// through the peers it stored, and keeps its desired state.
	nodes[0].stop()
	nodes[2].stop()
	a2 := start(t, "a2", nodes[2].dir, nil)
	key := manifest.KeyFor(manifest.KindDeployment, "default", "keep")
	if storedValue(a2, key) == "" {
		t.Fatal("restarted node lost its desired state")
	}
	waitFor(t, 15*time.Second, func() error {
		if got := a2.agent.mem.cluster.NumMembers(); got != 2 {
			return fmt.Errorf("a2 sees %d live members, want 2 (a1, a2)", got)
		}
		return nil
	})
	// The seed's replicas move to the two live nodes.
	waitFor(t, 20*time.Second, func() error { return runningEverywhere([]*testNode{nodes[1], a2}, "keep", 3) })
}

func TestNodeAwayLongerThanTombstoneTTLDoesNotResurrectDeletes(t *testing.T) {
	ttl := func(c *testSetup) { c.TombstoneTTL = 1 * time.Second }
	a0 := start(t, "a0", t.TempDir(), nil, ttl)
	a1 := start(t, "a1", t.TempDir(), []string{a0.addr()}, ttl)
	a2 := start(t, "a2", t.TempDir(), []string{a0.addr()}, ttl)
	deploy(t, a0, "ghost", 1, "img:v1")
	key := manifest.KeyFor(manifest.KindDeployment, "default", "ghost")
	waitFor(t, 10*time.Second, func() error {
		if storedValue(a2, key) == "" {
			return fmt.Errorf("a2 has not received the write")
		}
		return nil
	})
	a2.stop()
	// Delete while a2 is away, then let the tombstone expire and be purged.
	rec, _, _ := a0.agent.store.Get(key)
	rec.Deleted, rec.Value, rec.Version, rec.Origin = true, nil, a0.agent.clock.Now(), "a0"
	if err := a0.agent.mem.writer.publish(rec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() error {
		if r, ok, _ := a1.agent.store.Get(key); !ok || !r.Deleted {
			return fmt.Errorf("a1 has not seen the delete")
		}
		return nil
	})
	time.Sleep(1500 * time.Millisecond)
	a0.agent.mem.members.purgeTombstones()
	a1.agent.mem.members.purgeTombstones()
	// a2 comes back with its stale copy: it must drop it, not spread it.
	back := start(t, "a2", a2.dir, []string{a0.addr()}, ttl)
	time.Sleep(2 * time.Second)
	for _, n := range []*testNode{a0, a1, back} {
		if v := storedValue(n, key); v != "" {
			t.Fatalf("%s: deleted object came back", n.name)
		}
	}
	if ids := back.rt.ids(); len(ids) != 0 {
		t.Fatalf("a2 runs %v for a deleted object", ids)
	}
}

// TestStoppedAgentStaysAMember: SIGTERM does not leave the cluster (most
// stops are restarts): peers never hold the node "left", which would
// make them replace its replicas at once, and find it dead by failure
// detection if it stays down.
func TestStoppedAgentStaysAMember(t *testing.T) {
	nodes := startCluster(t, 3)
	nodes[2].stop() // what SIGTERM does
	waitFor(t, 30*time.Second, func() error {
		for _, m := range nodes[0].agent.mem.cluster.Members() {
			if m.Name == "a2" && m.State == gossip.StateLeft {
				t.Fatalf("a0 sees a2 left after a stop, want alive until failure detection finds it dead")
			}
			if m.Name == "a2" && m.State != gossip.StateDead {
				return fmt.Errorf("a0 sees a2 %s, want dead", m.State)
			}
		}
		return nil
	})
}

func TestPartitionedAgentsConvergeAfterHeal(t *testing.T) {
	network := testnet.New()
	var nodes []*testNode
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("p%d", i)
		tr, err := network.Transport(name)
		if err != nil {
			t.Fatal(err)
		}
		var join []string
		if i > 0 {
			join = []string{nodes[0].addr()}
		}
		nodes = append(nodes, start(t, name, t.TempDir(), join, func(c *testSetup) {
			c.tuneGossip = func(g *gossip.Config) { fastGossip(g); g.Transport = tr }
		}))
	}
	waitFor(t, 20*time.Second, func() error {
		for _, n := range nodes {
			if got := n.agent.mem.cluster.NumMembers(); got != 5 {
				return fmt.Errorf("%s sees %d members", n.name, got)
			}
		}
		return nil
	})
	// Split 2 | 3 and write on both sides; each side runs what it sees.
	network.Partition([]string{"p0", "p1"}, []string{"p2", "p3", "p4"})
	deploy(t, nodes[0], "left", 2, "img:v1")
	deploy(t, nodes[4], "right", 3, "img:v1")
	waitFor(t, 30*time.Second, func() error { return runningEverywhere(nodes[:2], "left", 2) })
	waitFor(t, 30*time.Second, func() error { return runningEverywhere(nodes[2:], "right", 3) })
	// Heal: both writes reach every node and each replica runs exactly once.
	network.Heal()
	waitFor(t, 60*time.Second, func() error {
		for _, key := range []string{"left", "right"} {
			k := manifest.KeyFor(manifest.KindDeployment, "default", key)
			for _, n := range nodes {
				if storedValue(n, k) == "" {
					return fmt.Errorf("%s lacks %s", n.name, key)
				}
			}
		}
		if err := runningEverywhere(nodes, "left", 2); err != nil {
			return err
		}
		return runningEverywhere(nodes, "right", 3)
	})
}

func TestNodesClaimDistinctSubnetsAndKeepThemAcrossRestarts(t *testing.T) {
	nodes := startCluster(t, 5)
	seen := map[string]string{}
	for _, n := range nodes {
		c := n.agent.own.subnets.current()
		if c.Subnet == "" || !n.agent.own.subnets.settled.Load() {
			t.Fatalf("%s has no settled subnet: %+v", n.name, c)
		}
		if other, dup := seen[c.Subnet]; dup {
			t.Fatalf("%s and %s both hold %s", n.name, other, c.Subnet)
		}
		seen[c.Subnet] = n.name
	}
	before := nodes[3].agent.own.subnets.current()
	nodes[3].stop()
	again := start(t, nodes[3].name, nodes[3].dir, []string{nodes[0].addr()}, func(c *testSetup) { c.SubnetSettle = 200 * time.Millisecond })
	waitFor(t, 10*time.Second, func() error {
		if !again.agent.own.subnets.settled.Load() {
			return fmt.Errorf("restarted node has not settled its subnet")
		}
		return nil
	})
	if got := again.agent.own.subnets.current(); got.Subnet != before.Subnet {
		t.Fatalf("restart changed the subnet: %s -> %s", before.Subnet, got.Subnet)
	}
}

// TestForgottenNodesWritesStayWithTheCluster: a Deployment applied
// through a node that is later forgotten (its key revoked) still reaches
// a node that joins afterwards: forgetting adopts what the node wrote for
// the cluster (written again under the forgetting node's key) before the
// revocation, so the newcomer does not refuse it as signed by a revoked
// key.
func TestForgottenNodesWritesStayWithTheCluster(t *testing.T) {
	nodes := startCluster(t, 3)
	deploy(t, nodes[1], "via-forgotten", 2, "img:v1")
	key := manifest.KeyFor(manifest.KindDeployment, "default", "via-forgotten")
	waitFor(t, 10*time.Second, func() error {
		for _, n := range nodes {
			if storedValue(n, key) == "" {
				return fmt.Errorf("%s lacks the Deployment", n.name)
			}
		}
		return nil
	})
	nodes[1].stop() // leaves
	waitFor(t, 10*time.Second, func() error {
		for _, m := range nodes[0].agent.mem.cluster.Members() {
			if m.Name == nodes[1].name && m.State == "alive" {
				return fmt.Errorf("%s still alive", m.Name)
			}
		}
		return nil
	})
	if _, err := nodes[0].agent.api.info.forgetNode(nodes[1].name); err != nil {
		t.Fatal(err)
	}
	rec, _, _ := nodes[0].agent.store.Get(key)
	if rec.Origin != nodes[0].name {
		t.Fatalf("the Deployment is still %s's record", rec.Origin)
	}
	late := start(t, "late", t.TempDir(), []string{nodes[0].addr()})
	waitFor(t, 15*time.Second, func() error {
		if storedValue(late, key) == "" {
			return errors.New("the node that joined after the forget lacks the Deployment")
		}
		return nil
	})
}

// A node that restarts with its data acts first on a view that holds the
// cluster it joined: a view built before the join holds this node alone
// as live, and acting on it started every replica of the cluster on the
// returning node (200 of 200 in the 20-node simulation).
func TestReturningNodeActsOnlyOnTheJoinedView(t *testing.T) {
	nodes := startCluster(t, 3)
	deploy(t, nodes[0], "many", 30, "img:v1")
	waitFor(t, 20*time.Second, func() error { return runningEverywhere(nodes, "many", 30) })
	nodes[2].stop()
	waitFor(t, 20*time.Second, func() error { return runningEverywhere(nodes[:2], "many", 30) })
	back := start(t, "a2", nodes[2].dir, []string{nodes[0].addr()})
	waitFor(t, 20*time.Second, func() error {
		if n := len(back.rt.ids()); n < 5 {
			return fmt.Errorf("the returning node runs %d replicas", n)
		}
		return runningEverywhere([]*testNode{nodes[0], nodes[1], back}, "many", 30)
	})
	back.rt.mu.Lock()
	created := back.rt.created
	back.rt.mu.Unlock()
	// Its share is about 10; placement moves a few more on a return.
	if created > 20 {
		t.Fatalf("the returning node created %d of 30 replicas, want about its share (10)", created)
	}
	t.Logf("the returning node created %d of 30 replicas", created)
}

// A node that restarts while no peer answers (after a power cut, its
// switch or its peers still booting) does not start every replica of
// the cluster at once, as the only live member of its view: it keeps
// what it runs and acts on its local state alone only after
// --failover-timeout without an answer; then it does (the cluster's work
// keeps running when every peer is gone).
func TestRestartWithNoPeerWaitsBeforeActingAlone(t *testing.T) {
	nodes := startCluster(t, 3)
	deploy(t, nodes[0], "many", 30, "img:v1")
	waitFor(t, 20*time.Second, func() error { return runningEverywhere(nodes, "many", 30) })
	for _, n := range nodes {
		n.stop()
	}
	const grace = 6 * time.Second
	started := time.Now()
	back := start(t, "a2", nodes[2].dir, []string{nodes[0].addr()}, func(c *testSetup) {
		c.FenceTimeout, c.FailoverTimeout = time.Second, grace
	})
	created := func() int {
		back.rt.mu.Lock()
		defer back.rt.mu.Unlock()
		return back.rt.created
	}
	for time.Since(started) < grace-time.Second {
		if n := created(); n > 0 {
			t.Fatalf("%v after restarting with no peer answering, the node created %d replicas", time.Since(started).Round(time.Millisecond), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, 20*time.Second, func() error { return runningEverywhere([]*testNode{back}, "many", 30) })
	t.Logf("alone after %v: runs all 30 replicas", time.Since(started).Round(time.Millisecond))
}

// A node started under the name of a live node never acts, however long
// its joins fail with the name taken: the wait before acting alone
// (--failover-timeout) is for peers that do not answer, not for a name
// the cluster refuses.
func TestNodeWithATakenNameNeverActs(t *testing.T) {
	nodes := startCluster(t, 2)
	deploy(t, nodes[0], "few", 4, "img:v1")
	waitFor(t, 20*time.Second, func() error { return runningEverywhere(nodes, "few", 4) })
	const grace = 6 * time.Second
	twin := start(t, nodes[1].name, t.TempDir(), []string{nodes[0].addr()}, func(c *testSetup) {
		c.FenceTimeout, c.FailoverTimeout = time.Second, grace
	})
	time.Sleep(grace + 2*time.Second)
	twin.rt.mu.Lock()
	created := twin.rt.created
	twin.rt.mu.Unlock()
	if twin.agent.mem.members.IsSynced() || created > 0 {
		t.Fatalf("a node under a live node's name: synced %v, created %d replicas after %v", twin.agent.mem.members.IsSynced(), created, grace+2*time.Second)
	}
}
