package node

import (
	"io"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/view"
)

// hooks are what in-process tests and the scale simulation change of an
// agent, kept out of Config (what an operator sets): New passes none.
type hooks struct {
	// dryRunOut receives the dry-run output (nil: stdout).
	dryRunOut io.Writer
	// store, when set, is the store to use instead of badger in DataDir
	// (in-process simulations keep store.Memory across restarts).
	store Store
	// tuneGossip, when set, adjusts the gossip configuration (loopback
	// ports, fast timers).
	tuneGossip func(*gossip.Config)
	// shareDecodes, when set, is shared by the agents of one process
	// (the scale simulation) to decode identical records once.
	shareDecodes *view.DecodeShare
}
