package node

import (
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/store"
)

// Store is the node's copy of the desired state and its node-local meta
// values: the badger store on disk (store.Store), or store.Memory for
// in-process simulations of many nodes. It is gossip's State as well.
type Store interface {
	Apply(r crdt.Record) (bool, error)
	Get(key string) (crdt.Record, bool, error)
	List(prefix string) ([]crdt.Record, error)
	Snapshot() (crdt.Map, error)
	// Changed receives a value after writes that changed records.
	Changed() <-chan struct{}
	Purge(now time.Time, ttl time.Duration) (int, error)
	GetMeta(key string) ([]byte, bool, error)
	PutMeta(key string, value []byte) error
	DropRecords() error
	Close() error
}

var (
	_ Store = (*store.Store)(nil)
	_ Store = (*store.Memory)(nil)
)
