package node

import (
	"sync"
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

// tracked is a Store that records the keys its writes changed, so the
// view reads again only those: listing and comparing every node's status
// record on each rebuild and on each subnet claim received was O(N) per
// change, O(N^3) across a forming cluster of N nodes (a third of the CPU
// of 1,000 simulated nodes).
type tracked struct {
	Store
	mu    sync.Mutex
	dirty map[string]struct{}
	all   bool // a purge or drop: any record may have changed
}

func track(s Store) *tracked { return &tracked{Store: s, dirty: map[string]struct{}{}, all: true} }

// Apply is Store.Apply, noting r's key when it changed anything (or
// failed part way).
func (t *tracked) Apply(r crdt.Record) (bool, error) {
	changed, err := t.Store.Apply(r)
	if changed || err != nil {
		t.mu.Lock()
		t.dirty[r.Key] = struct{}{}
		t.mu.Unlock()
	}
	return changed, err
}

// Purge is Store.Purge; any record may be gone after it.
func (t *tracked) Purge(now time.Time, ttl time.Duration) (int, error) {
	n, err := t.Store.Purge(now, ttl)
	if n > 0 || err != nil {
		t.setAll()
	}
	return n, err
}

// DropRecords is Store.DropRecords; every record is gone after it.
func (t *tracked) DropRecords() error {
	err := t.Store.DropRecords()
	t.setAll()
	return err
}

func (t *tracked) setAll() {
	t.mu.Lock()
	t.all = true
	t.mu.Unlock()
}

// take returns the keys changed since the last take, or all when any
// record may have changed (a purge, a drop, or the first take).
func (t *tracked) take() (keys []string, all bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	all = t.all
	if !all {
		keys = make([]string, 0, len(t.dirty))
		for k := range t.dirty {
			keys = append(keys, k)
		}
	}
	t.all = false
	clear(t.dirty)
	return keys, all
}
