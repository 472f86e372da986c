package node

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/testnet"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/store"
	"github.com/starling-orchestrator/starling/node/view"
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
	returnAndCount(t, 0)
}

// Until a returning node's first record of its new run reaches a peer,
// the peer holds the record the node published before it crashed, which
// lists the replicas the peer took over as running on the node since
// before the peer's copies started. Placement keeps the oldest running
// copy: taken at its word, the peer stopped its copy for the returning
// node to start it again (at 300 nodes its new record had not reached
// every peer 11 s after the return, when the node counted again). The
// node's metadata names its new run, so the old record lists nothing
// running: peers that do not get the new record for 20 s keep their
// copies.
func TestPeersKeepWhatTheyTookOverWhileAReturningNodesRecordIsLate(t *testing.T) {
	returnAndCount(t, 20*time.Second)
}

// returnAndCount runs the return of TestReturningNodeStartsNothingItsPeersKept;
// the peers' stores refuse the returning node's node records for late
// after it starts again (0: none refused). Every replica must run
// exactly once at every look from the return on, and the returning node
// start none.
func returnAndCount(t *testing.T, late time.Duration) {
	synctest.Test(t, func(t *testing.T) {
		const n, deployments, replicas = 12, 8, 8 * 6
		c := &simCluster{t: t, mem: testnet.NewMem(time.Millisecond), pool: store.NewPool()}
		var refuseFrom, refuseUntil atomic.Int64 // the returning node's index, virtual Unix ns
		refuseFrom.Store(-1)
		for i := range n {
			nd := &simNode{name: fmt.Sprintf("r%02d", i), rt: newFakeRuntime(), store: store.NewMemoryPooled(c.pool)}
			nd.conf = func(cfg *testSetup) {
				cfg.store = refusing{Store: cfg.store, refuse: func(key string) bool {
					from := refuseFrom.Load()
					return from >= 0 && from != int64(i) && key == view.StatusKey(fmt.Sprintf("r%02d", from)) && time.Now().UnixNano() < refuseUntil.Load()
				}}
			}
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
				if nd.agent.mem.cluster.NumMembers() != n || !nd.agent.own.subnets.settled.Load() {
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
		if _, err := c.nodes[0].agent.api.objects.store(objs); err != nil {
			t.Fatal(err)
		}
		if _, ok := wait(time.Minute, 100*time.Millisecond, func() bool { return c.singleOwners(replicas) }); !ok {
			t.Fatal("the replicas do not each run once")
		}
		// One return, or three in turn when the peers refuse the
		// returning node's records: each return has a few replicas that
		// placement would give back to the returning node.
		rounds := 1
		if late > 0 {
			rounds = 3
		}
		var back []*simNode
		for round := range rounds {
			var gone *simNode
			for i, nd := range c.nodes[1:] {
				if running(nd) > 0 && !slices.Contains(back, nd) {
					gone = nd
					refuseFrom.Store(int64(i + 1))
					break
				}
			}
			if gone == nil {
				t.Fatal("no node other than the seed (and those back already) runs a replica")
			}
			back = append(back, gone)
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
			refuseUntil.Store(time.Now().Add(late).UnixNano())
			c.startNode(gone, []string{c.nodes[0].tr.Addr()})
			// Every 100 ms for 40 s (the node counts again after
			// --rejoin-settle, 10 s): every replica runs exactly once.
			start := time.Now()
			for time.Since(start) < 40*time.Second {
				if !c.singleOwners(replicas) {
					t.Fatalf("return %d (%s): %v after it, a replica does not run exactly once (peers stopped copies they had taken over, or it runs twice)",
						round+1, gone.name, time.Since(start).Round(time.Millisecond))
				}
				time.Sleep(100 * time.Millisecond)
			}
			if gone.agent.mem.cluster.NumMembers() != n || !gone.agent.own.subnets.settled.Load() {
				t.Fatalf("return %d (%s): the returning node did not settle", round+1, gone.name)
			}
			gone.rt.mu.Lock()
			started := gone.rt.created - created
			gone.rt.mu.Unlock()
			if started != 0 || running(gone) != 0 {
				t.Fatalf("return %d: %s started %d containers and runs %d; want none (its peers keep what they took over)", round+1, gone.name, started, running(gone))
			}
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

// refusing is a Store that takes no write of the keys refuse names (as if
// they never arrived).
type refusing struct {
	Store
	refuse func(key string) bool
}

func (r refusing) Apply(rec crdt.Record) (bool, error) {
	if r.refuse(rec.Key) {
		return false, nil
	}
	return r.Store.Apply(rec)
}
