package node

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/store"
	"github.com/starling-orchestrator/starling/node/trust"
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
	// Space checks the free space of the store's filesystem; while it is
	// full, writes are held in memory (store.Store.Space).
	Space() store.Space
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
//
// Its Changed channel is its own, signalled after the change is noted
// (the wrapped store's fires before: a reader woken by it could take the
// changed keys before this one is among them, and nothing would wake it
// again).
type tracked struct {
	Store
	changed chan struct{}
	mu      sync.Mutex
	dirty   map[string]struct{}
	all     bool // a purge or drop: any record may have changed
}

func track(s Store) *tracked {
	return &tracked{Store: s, changed: make(chan struct{}, 1), dirty: map[string]struct{}{}, all: true}
}

// Changed receives a value after writes through t that changed records.
func (t *tracked) Changed() <-chan struct{} { return t.changed }

// Apply is Store.Apply, noting r's key when it changed anything (or
// failed part way).
func (t *tracked) Apply(r crdt.Record) (bool, error) {
	changed, err := t.Store.Apply(r)
	if changed || err != nil {
		t.mu.Lock()
		t.dirty[r.Key] = struct{}{}
		t.mu.Unlock()
		t.notify()
	}
	return changed, err
}

// Purge is Store.Purge; any record may be gone after it.
func (t *tracked) Purge(now time.Time, ttl time.Duration) (int, error) {
	n, err := t.Store.Purge(now, ttl)
	if n > 0 || err != nil {
		t.SetAll()
	}
	return n, err
}

// DropRecords is Store.DropRecords; every record is gone after it.
func (t *tracked) DropRecords() error {
	err := t.Store.DropRecords()
	t.SetAll()
	return err
}

// SetAll notes that any record may have changed (a purge, a drop, or a
// read of the changes that failed).
func (t *tracked) SetAll() {
	t.mu.Lock()
	t.all = true
	t.mu.Unlock()
	t.notify()
}

func (t *tracked) notify() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// Take returns the keys changed since the last Take, or all when any
// record may have changed (a purge, a drop, or the first Take).
func (t *tracked) Take() (keys []string, all bool) {
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

// writer signs records with this node's key, writes them to the local
// store (durably) and gossips them: what every part that writes records
// is given. The objects were validated before, so an error is an I/O
// failure.
type writer struct {
	id      *trust.Identity
	cluster *gossip.Cluster
	store   Store
}

// publish signs and gossips recs, in order; it stops at the first error.
func (w *writer) publish(recs ...crdt.Record) error {
	for _, r := range recs {
		r, err := w.id.Sign(r)
		if err != nil {
			return fmt.Errorf("sign %s: %w", r.Key, err)
		}
		if err := w.cluster.Publish(r); err != nil {
			return fmt.Errorf("store and gossip %s: %w", r.Key, err)
		}
	}
	return nil
}

// PublishDurable is publish for a write a user waits on (the API). While
// the data directory's filesystem is full the store would only hold it in
// memory (store.Store.ApplyAll), so it is refused: HTTP 507 Insufficient
// Storage, with a message that names the directory and ENOSPC. Records
// of the node's own state (its status, its subnet claim) and records from
// peers go on through publish: they are held and written once space
// returns, and peers repeat them after a restart.
func (w *writer) PublishDurable(recs ...crdt.Record) error {
	if sp := w.store.Space(); sp.Full {
		return api.NewError(http.StatusInsufficientStorage, &store.NoSpaceError{Op: "write", Dir: sp.Dir, Free: sp.Free})
	}
	return w.publish(recs...)
}
