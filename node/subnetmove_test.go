package node

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/ipam"
)

// TestDisplacedSettledClaimMoves: two nodes that could not hear each other
// settled the same subnet, each running pods on it (the two sides of a
// partition, or nodes forming faster than records spread). When they
// meet, the node whose claim is later refuses the earlier one's record
// (it would take its settled subnet) and learns from that refusal that
// it lost: it moves to another subnet, rebuilds its pods there, and both
// nodes end up ready and eligible in both views. Before settled claims
// could move, both kept the subnet for good and each refused the other.
func TestDisplacedSettledClaimMoves(t *testing.T) {
	early, late := collidingNames(256) // the default --cluster-cidr, a /16
	a := start(t, early, t.TempDir(), nil)
	waitFor(t, 10*time.Second, func() error { return settledOn(a) })
	// A cluster of its own: it cannot hear a. Its label keeps the
	// "pinned" replicas on it alone, so they run on through the move.
	b := start(t, late, t.TempDir(), nil, func(c *testSetup) { c.Labels = map[string]string{"pin": "b"} })
	waitFor(t, 10*time.Second, func() error { return settledOn(b) })
	shared := a.agent.own.subnets.current().Subnet
	if got := b.agent.own.subnets.current().Subnet; got != shared {
		t.Fatalf("the two nodes claimed %s and %s: the names do not collide", shared, got)
	}
	deploy(t, b, "before", 3, "img:v1")
	deployPod(t, b, "pinned", 2, "img:v1", "      nodeSelector: {pin: b}\n")
	waitFor(t, 10*time.Second, func() error { return runningEverywhere([]*testNode{b}, "before", 3) })
	waitFor(t, 10*time.Second, func() error { return runningEverywhere([]*testNode{b}, "pinned", 2) })

	if _, err := b.agent.mem.cluster.Join([]string{a.addr()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() error {
		if err := settledOn(b); err != nil {
			return err
		}
		if got := b.agent.own.subnets.current().Subnet; got == shared {
			return fmt.Errorf("%s still holds %s, settled earlier by %s", b.name, got, a.name)
		}
		for _, n := range []*testNode{a, b} {
			v := n.agent.views.View()
			for _, m := range []*testNode{a, b} {
				s, ok := v.Statuses[m.name]
				if !ok || !s.SubnetReady || !v.Winners[m.name] || s.PodSubnet != m.agent.own.subnets.current().Subnet {
					return fmt.Errorf("%s's view of %s: %+v (winner %v)", n.name, m.name, s.PodSubnet, v.Winners[m.name])
				}
			}
		}
		return nil
	})
	if got := a.agent.own.subnets.current().Subnet; got != shared {
		t.Fatalf("%s, whose claim was earlier, moved: %s -> %s", a.name, shared, got)
	}
	// Every pod of the moved node has an address of its new subnet: the
	// ones set up on the old one were rebuilt.
	moved := netip.MustParsePrefix(b.agent.own.subnets.current().Subnet)
	waitFor(t, 30*time.Second, func() error {
		if err := runningEverywhere([]*testNode{a, b}, "before", 3); err != nil {
			return err
		}
		if err := runningEverywhere([]*testNode{b}, "pinned", 2); err != nil {
			return err
		}
		cs, _ := b.rt.List(context.Background())
		for _, c := range cs {
			if ip, err := netip.ParseAddr(c.PodIP); err != nil || !moved.Contains(ip) {
				return fmt.Errorf("%s runs %s at %s, outside its subnet %s", b.name, c.ID, c.PodIP, moved)
			}
		}
		return nil
	})
}

// settledOn fails until n's pod subnet claim settled.
func settledOn(n *testNode) error {
	if c := n.agent.own.subnets.current(); c.Subnet == "" || !n.agent.own.subnets.settled.Load() {
		return fmt.Errorf("%s has no settled subnet yet (%+v)", n.name, c)
	}
	return nil
}

// A member that says it settled a live node's subnet earlier (a
// backdated claim) does not make that node move: every honest node
// refuses the claim, and none of the subnet's arbiters names its
// claimant. Without the arbiters' word the victim moved, and the
// claimant then held its subnet.
func TestBackdatedClaimDoesNotMoveItsVictim(t *testing.T) {
	nodes := startCluster(t, 4)
	victim, evil := nodes[1], nodes[3]
	mine := victim.agent.own.subnets.current()
	forged := ipam.Claim{Node: evil.name, Subnet: mine.Subnet, Since: hlc.Timestamp{Wall: mine.Since.Wall - int64(time.Hour)}}
	evil.agent.own.subnets.set(forged, false)
	evil.agent.own.status.republish()
	waitFor(t, 10*time.Second, func() error {
		victim.agent.own.subnets.mu.Lock()
		_, noted := victim.agent.own.subnets.rivals[evil.name]
		victim.agent.own.subnets.mu.Unlock()
		if !noted {
			return fmt.Errorf("%s has not refused %s's claim on its subnet yet", victim.name, evil.name)
		}
		return nil
	})
	time.Sleep(2 * keepCheckEvery) // checks on the refusal and on the tick
	if got := victim.agent.own.subnets.current(); got.Subnet != mine.Subnet || !victim.agent.own.subnets.settled.Load() {
		t.Fatalf("%s moved from %s to %+v on a backdated claim", victim.name, mine.Subnet, got)
	}
	for _, n := range nodes[:3] {
		if s := n.agent.views.View().Statuses[evil.name]; s.PodSubnet == mine.Subnet {
			t.Fatalf("%s holds %s's backdated claim", n.name, evil.name)
		}
	}
}
