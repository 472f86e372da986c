package node

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-orchestrator/starling/gossip/testnet"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/store"
)

// A node back from a crash holds its peers' records from before it, which
// list none of the replicas they took over while it was away. It must
// act on the records its join brings, not on those: 12 nodes, 8
// Deployments of 6 (4 replicas a node), none of which the peers need to
// give back (each stays under its load bound of 5 and under the spread of
// one replica of a Deployment a node), so the returning node starts
// nothing.
// Before it waited for the join's records it started its old replica
// again, then stopped it once it heard its peer ran it (a copy, a
// Terminating and a removal, each a node record sent to every node).
func TestReturningNodeStartsNothingItsPeersKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, deployments, replicas = 12, 8, 8 * 6
		c := &simCluster{t: t, mem: testnet.NewMem(time.Millisecond), pool: store.NewPool()}
		for i := range n {
			nd := &simNode{name: fmt.Sprintf("r%02d", i), rt: newFakeRuntime(), store: store.NewMemoryPooled(c.pool)}
			var join []string
			if i > 0 {
				join = []string{c.nodes[0].tr.Addr()}
			}
			c.startNode(nd, join)
			c.nodes = append(c.nodes, nd)
		}
		defer c.stopAll()
		if _, ok := wait(3*time.Minute, 500*time.Millisecond, func() bool {
			for _, nd := range c.nodes {
				if nd.agent.cluster.NumMembers() != n || !nd.agent.subnets.isReady() {
					return false
				}
			}
			return true
		}); !ok {
			t.Fatal("the cluster did not form")
		}
		var objs []manifest.Object
		for d := range deployments {
			objs = append(objs, simDeployment(fmt.Sprintf("sim-%d", d), replicas/deployments))
		}
		if _, err := c.nodes[0].agent.objects.store(objs); err != nil {
			t.Fatal(err)
		}
		if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool { return c.singleOwners(replicas) }); !ok {
			t.Fatal("the replicas do not each run once")
		}
		var gone *simNode
		for _, nd := range c.nodes[1:] {
			if running(nd) > 0 {
				gone = nd
				break
			}
		}
		if gone == nil {
			t.Fatal("no node other than the seed runs a replica")
		}
		c.crash(gone)
		if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool { return c.singleOwners(replicas) }); !ok {
			t.Fatal("the failed node's replica was not taken over")
		}
		// Away 30 s, as in the simulation: far less than the tombstone
		// TTL, so the returning node keeps its (stale) state.
		time.Sleep(30 * time.Second)
		gone.rt.mu.Lock()
		created := gone.rt.created
		gone.rt.mu.Unlock()
		c.startNode(gone, []string{c.nodes[0].tr.Addr()})
		if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool {
			return gone.agent.cluster.NumMembers() == n && gone.agent.subnets.isReady() && c.singleOwners(replicas)
		}); !ok {
			t.Fatal("the returning node did not settle")
		}
		time.Sleep(10 * time.Second)
		gone.rt.mu.Lock()
		started := gone.rt.created - created
		gone.rt.mu.Unlock()
		if started != 0 || running(gone) != 0 || !c.singleOwners(replicas) {
			t.Fatalf("the returning node started %d containers and runs %d; want none (its peers keep what they took over)", started, running(gone))
		}
	})
}

// running counts the simulation's containers node n runs.
func running(n *simNode) int {
	n.rt.mu.Lock()
	defer n.rt.mu.Unlock()
	k := 0
	for _, ct := range n.rt.containers {
		if strings.HasPrefix(ct.Workload, "sim-") {
			k++
		}
	}
	return k
}
