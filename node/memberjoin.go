package node

import (
	"context"
	"time"
)

// What a joining node does besides joining (members.joinLoop): when its
// peers say it was forgotten, and while the records of a join arrive.

// forgotten is what a node does once a peer told it that 'starling node
// forget' revoked its key: it says so, never acts on its local state
// (joinLoop does not mark it synced, so it claims no subnet, publishes
// nothing and starts no replica), and stops the replicas it still runs
// once --fence-timeout has passed: they are the cluster's, and its peers
// started them elsewhere when it went down.
func (m *members) forgotten(ctx context.Context) {
	m.log.Error("this node was forgotten: 'starling node forget "+m.self+"' revoked its key, so its peers refuse it. It starts nothing, and stops the replicas it still runs after --fence-timeout. To bring the machine back, stop the agent, remove node.key, node.crt, ca.crt and gossip.key from its --data-dir and start it with a new invitation ('starling join-token "+m.self+"')",
		"stopIn", m.fenceTimeout)
	go func() {
		select {
		case <-ctx.Done():
		case <-time.After(m.fenceTimeout):
			close(m.stopReplicas)
		}
	}()
}

// waitForState waits, after a join, until the records stop arriving (2 s
// without a change, at most limit): acting on a half-received state
// would stop replicas that are still desired (after dropped state) or
// start replicas that peers took over while this node was away (after
// a crash).
func waitForState(ctx context.Context, changed func() <-chan struct{}, limit time.Duration) {
	deadline := time.After(limit)
	for {
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			return
		case <-changed():
		case <-time.After(2 * time.Second):
			return
		}
	}
}
