// Package store keeps a node's copy of the desired state, a set of
// crdt.Records, durably on local disk in a badger (github.com/dgraph-io/badger)
// key-value store, together with a few node-local values (meta).
//
// The store enforces the CRDT rule itself: Apply writes a record only if it
// wins over the stored one (crdt.Record.Wins), comparing and writing in one
// badger transaction, so concurrent writers, gossip receivers and local API
// calls alike, cannot lose a newer write to an older one.
//
// Key layout inside badger: "r/" + Record.Key holds crdt.EncodeRecord(record);
// "m/" + meta key holds a meta value. The prefixes keep meta out of List and
// Snapshot.
package store

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

const (
	recordPrefix = "r/"
	metaPrefix   = "m/"

	// maxConflictRetries bounds how often one Apply restarts after losing an
	// optimistic-concurrency race (badger.ErrConflict). Every conflict means
	// another writer committed, so the store as a whole always progresses; the
	// bound only turns a pathological livelock into an error.
	maxConflictRetries = 100

	// purgeBatch is how many tombstones Purge deletes per transaction, far
	// below badger's per-transaction limit (see MemTableSize in badgerOptions).
	purgeBatch = 1000

	// vlogDiscardRatio is badger's recommended value-log GC threshold: rewrite
	// a value-log file once half of it is garbage (badger DB.RunValueLogGC doc).
	vlogDiscardRatio = 0.5
)

// Errors returned (wrapped; match with errors.Is) by Store methods.
var (
	// ErrClosed: the Store has been closed.
	ErrClosed = errors.New("store: closed")
	// ErrCorrupt: a stored record could not be decoded or is stored under the
	// wrong key. The message names the key.
	ErrCorrupt = errors.New("store: corrupt record")
	// ErrBatchTooLarge: an ApplyAll batch does not fit in one badger
	// transaction (a few MiB, see badgerOptions); nothing was written. Split
	// the batch and retry.
	ErrBatchTooLarge = errors.New("store: batch too large for one transaction")
)

// Store is a durable set of crdt.Records plus node-local meta values, kept in
// one directory. It is safe for concurrent use. Close it when done.
type Store struct {
	db      *badger.DB
	dir     string
	log     *slog.Logger
	changed chan struct{}
	statfs  func(dir string) (uint64, error)

	// Free space (space.go): full stops writes to disk; free is the
	// last statfs.
	spaceMu sync.Mutex
	full    bool
	free    uint64

	// Records written while full, buffered in memory (space.go), with their
	// encoded sizes.
	bufMu    sync.Mutex
	buffered map[string]crdt.Record
	bufSize  map[string]int
	bufBytes int

	// mu is held shared by every operation and exclusively by Close and
	// reopen, so that no operation touches a closed badger DB or sends on
	// a closed channel.
	mu     sync.RWMutex
	closed bool
	// readOnly: badger was opened read-only because the filesystem was
	// full at Open (space.go, openFull); set and cleared under mu held
	// exclusively. The store is full while it is set.
	readOnly bool
}

// Open opens the store in dir, creating dir (mode 0700) and an empty store if
// needed. Only one Store may have dir open at a time, in any process: badger
// holds a lock file and Open fails while another holder has it. badger's own
// log messages of level warning and above go to slog.Default() with
// component=badger.
//
// On a full filesystem (below MinFree bytes free) Open succeeds and the
// store starts full: see Space.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	s := &Store{dir: dir, log: slog.Default().With("component", "store", "dir", dir), changed: make(chan struct{}, 1),
		statfs: freeBytes, buffered: map[string]crdt.Record{}, bufSize: map[string]int{}}
	s.openSpace()
	if s.full {
		// badger's read-write open writes through mmap (a new memtable,
		// the flush of the replayed one, a value log header): with no
		// free block that is a SIGBUS, not an error.
		db, err := openFull(dir, s.free, slog.Default().With("component", "badger", "dir", dir))
		if err != nil {
			return nil, err
		}
		s.db, s.readOnly = db, true
		return s, nil
	}
	db, err := badger.Open(badgerOptions(dir, slog.Default().With("component", "badger", "dir", dir)))
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	s.db = db
	return s, nil
}

// badgerOptions tunes badger for a small edge node holding at most some
// thousands of records of up to ~1 MiB each, instead of badger's defaults for
// a database server (64 MiB memtables x5, 256 MiB block cache, 1 GiB value
// log files, 4 compactors, metrics).
func badgerOptions(dir string, log *slog.Logger) badger.Options {
	return badger.DefaultOptions(dir).
		WithLogger(slogLogger{log}).
		// Apply promises durability on return.
		WithSyncWrites(true).
		// Apply's read-compare-write relies on badger's conflict detection.
		WithDetectConflicts(true).
		// A 16 MiB memtable caps one transaction at 15% of it, 2.4 MiB
		// (badger checkAndSetOptions: maxBatchSize), which still holds the
		// largest record. Memtable memory is allocated lazily, so an idle
		// node pays only for what it wrote since the last flush.
		WithMemTableSize(16 << 20).
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(8).
		WithBaseTableSize(2 << 20).
		WithBaseLevelSize(8 << 20).
		// Keep values inside the LSM tree up to badger's maximum (1 MiB), so
		// the value log, which needs garbage collection, holds only the rare
		// record above that.
		WithValueThreshold(1 << 20).
		WithValueLogFileSize(16 << 20).
		// No compression, hence no block cache (badger requires one only for
		// compressed or encrypted tables): the working set is small and the OS
		// page cache serves it; a ristretto cache would add goroutines and a
		// fixed memory budget for nothing. Table indexes stay in memory.
		WithCompression(options.None).
		WithBlockCacheSize(0).
		WithIndexCacheSize(0).
		// Two is badger's minimum number of compactors other than zero.
		WithNumCompactors(2).
		WithNumGoroutines(2).
		WithMetricsEnabled(false)
}

// slogLogger routes badger's logging to slog, dropping info and debug
// messages: badger logs every compaction and flush at info level.
type slogLogger struct{ log *slog.Logger }

func (l slogLogger) Errorf(f string, args ...any) {
	l.log.Error(strings.TrimSpace(fmt.Sprintf(f, args...)))
}

func (l slogLogger) Warningf(f string, args ...any) {
	l.log.Warn(strings.TrimSpace(fmt.Sprintf(f, args...)))
}

func (slogLogger) Infof(string, ...any)  {}
func (slogLogger) Debugf(string, ...any) {}

// Close flushes and closes the store and closes the Changed channel. Later
// calls to any method return ErrClosed; a second Close returns nil.
// Records buffered in memory because the filesystem is full are written if
// it has room now, and lost otherwise (peers send them again).
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.checkSpace()
	if sp := s.spaceState(); sp.Buffered > 0 {
		s.log.Warn("closing with records buffered in memory on a full filesystem; peers send them again after the restart", "held", sp.Buffered)
	}
	s.closed = true
	close(s.changed)
	if s.full && !s.readOnly {
		// badger's close flushes its memtable through mmap: with the
		// ballast gone and its blocks taken, only the reserve leaves
		// room for it (a SIGBUS otherwise).
		s.dropReserve()
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}

// Changed returns a channel that receives a value after every write that
// changed the stored records (Apply, ApplyAll, Purge), never blocking the
// writer: it has a buffer of 1, so several writes in a row may yield a single
// value. A receiver should then re-read what it needs. The channel is closed
// by Close. Meta writes do not signal.
func (s *Store) Changed() <-chan struct{} { return s.changed }

// notify must be called with s.mu held (shared is enough).
func (s *Store) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// lock takes the shared lock and fails if the store is closed. On success the
// caller must s.mu.RUnlock().
func (s *Store) lock() error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

// Apply writes r if it wins over the record stored for r.Key (by
// crdt.Record.Wins) or no record is stored, and reports whether it wrote.
// Comparison and write happen in one transaction, retried if a concurrent
// writer committed first; the write is synced to disk before Apply returns.
//
// Errors wrap crdt.ErrInvalidRecord (r fails crdt.Record.Validate), ErrCorrupt
// (the stored record for r.Key is unreadable; Apply does not overwrite it),
// ErrClosed, or a badger I/O error.
func (s *Store) Apply(r crdt.Record) (bool, error) {
	written, err := s.ApplyAll([]crdt.Record{r})
	if err != nil {
		return false, err
	}
	return len(written) > 0, nil
}

// ApplyAll applies each record of rs as Apply does, all in one transaction:
// on error nothing is written. Records are applied in order, so of several
// records for one key the winner among them and the stored one remains.
//
// It returns the records that were written and are still the stored record
// for their key after the batch, one per key, in order of first write; nil if
// nothing changed. Errors are those of Apply, plus ErrBatchTooLarge when the
// batch exceeds one transaction (about 2.4 MiB of encoded records).
//
// While the filesystem is full (Space), the records are buffered in memory
// instead, with the same rule, and written to disk when space returns;
// reads see them. Past 64 MiB held, ApplyAll fails with a *NoSpaceError
// (ErrNoSpace). A caller that promises durability (the API) checks Space
// first.
func (s *Store) ApplyAll(rs []crdt.Record) ([]crdt.Record, error) {
	// Encode, and so validate, before touching the database: an invalid
	// record fails the whole batch without a write.
	enc := make([][]byte, len(rs))
	for i, r := range rs {
		b, err := crdt.EncodeRecord(r)
		if err != nil {
			return nil, fmt.Errorf("apply record %q: %w", r.Key, err)
		}
		enc[i] = b
	}
	if len(rs) == 0 {
		return nil, nil
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	var written []crdt.Record
	var err error
	if s.checkSpace() {
		written, err = s.applyDisk(rs, enc)
	} else {
		written, err = s.hold(rs, enc)
	}
	if err != nil {
		return nil, fmt.Errorf("apply %d records: %w", len(rs), err)
	}
	if len(written) > 0 {
		s.notify()
	}
	return written, nil
}

// applyDisk writes rs to badger in one transaction, retried on conflict.
// Called with s.mu held (shared).
func (s *Store) applyDisk(rs []crdt.Record, enc [][]byte) ([]crdt.Record, error) {
	for attempt := 0; ; attempt++ {
		written, err := s.tryApply(rs, enc)
		if errors.Is(err, badger.ErrConflict) && attempt < maxConflictRetries {
			continue
		}
		return written, err
	}
}

func (s *Store) tryApply(rs []crdt.Record, enc [][]byte) ([]crdt.Record, error) {
	txn := s.db.NewTransaction(true)
	defer txn.Discard()
	var written []crdt.Record
	var index map[string]int // key -> position in written, for batches with repeated keys
	for i, r := range rs {
		k := []byte(recordPrefix + r.Key)
		cur, ok, err := getRecord(txn, k)
		if err != nil {
			return nil, err
		}
		if ok && !r.Wins(cur) {
			continue
		}
		if err := txn.Set(k, enc[i]); err != nil {
			if errors.Is(err, badger.ErrTxnTooBig) {
				return nil, fmt.Errorf("%w: at record %d of %d (%q): %w", ErrBatchTooLarge, i+1, len(rs), r.Key, err)
			}
			return nil, fmt.Errorf("write %q: %w", r.Key, err)
		}
		if j, seen := index[r.Key]; seen {
			written[j] = r
			continue
		}
		if index == nil {
			index = make(map[string]int)
		}
		index[r.Key] = len(written)
		written = append(written, r)
	}
	if len(written) == 0 {
		return nil, nil // nothing to commit; Discard drops the reads
	}
	if err := txn.Commit(); err != nil {
		return nil, err
	}
	return written, nil
}

// getRecord reads and decodes the record stored under the badger key k
// (recordPrefix included). ok is false if there is none.
func getRecord(txn *badger.Txn, k []byte) (r crdt.Record, ok bool, err error) {
	item, err := txn.Get(k)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return crdt.Record{}, false, nil
	}
	if err != nil {
		return crdt.Record{}, false, fmt.Errorf("read %q: %w", k[len(recordPrefix):], err)
	}
	r, err = decodeItem(item)
	return r, err == nil, err
}

// decodeItem decodes the record in item and checks it is stored under its own
// Key.
func decodeItem(item *badger.Item) (crdt.Record, error) {
	key := string(item.Key()[len(recordPrefix):])
	var r crdt.Record
	err := item.Value(func(v []byte) error {
		var err error
		r, err = crdt.DecodeRecord(v) // copies what it keeps out of v
		return err
	})
	if err != nil {
		return crdt.Record{}, fmt.Errorf("%w %q: %w", ErrCorrupt, key, err)
	}
	if r.Key != key {
		return crdt.Record{}, fmt.Errorf("%w %q: holds record for key %q", ErrCorrupt, key, r.Key)
	}
	return r, nil
}

// Get returns the record stored for key, a tombstone included (check
// Record.Deleted); ok is false if there is none. Errors wrap ErrCorrupt
// (naming key), ErrClosed, or a badger I/O error.
func (s *Store) Get(key string) (r crdt.Record, ok bool, err error) {
	if err := s.lock(); err != nil {
		return crdt.Record{}, false, err
	}
	defer s.mu.RUnlock()
	r, ok, err = s.getStored(key)
	if err != nil {
		return crdt.Record{}, false, fmt.Errorf("get %q: %w", key, err)
	}
	if h, held := s.bufferedRecord(key); held && (!ok || h.Wins(r)) {
		return h, true, nil
	}
	return r, ok, nil
}

// getStored reads key's record from badger. Called with s.mu held.
func (s *Store) getStored(key string) (r crdt.Record, ok bool, err error) {
	err = s.db.View(func(txn *badger.Txn) error {
		r, ok, err = getRecord(txn, []byte(recordPrefix+key))
		return err
	})
	return r, ok, err
}

// List returns every record whose Key starts with prefix, tombstones
// included, sorted by Key (byte order); "" lists everything. It reads one
// consistent snapshot. Errors are those of Get; on error no records are
// returned.
func (s *Store) List(prefix string) ([]crdt.Record, error) {
	var out []crdt.Record
	err := s.scan(prefix, func(r crdt.Record) { out = append(out, r) })
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	return out, nil
}

// Snapshot returns all records, tombstones included, as a crdt.Map read from
// one consistent snapshot. Errors are those of List.
func (s *Store) Snapshot() (crdt.Map, error) {
	m := crdt.Map{}
	if err := s.scan("", func(r crdt.Record) { m[r.Key] = r }); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return m, nil
}

// scan calls fn for each record whose Key starts with prefix, in Key
// order; a record buffered in memory (space.go) replaces the stored one it
// wins over.
func (s *Store) scan(prefix string, fn func(crdt.Record)) error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	held := s.bufferedWithPrefix(prefix)
	if len(held) == 0 {
		return s.scanStored(prefix, fn)
	}
	slices.SortFunc(held, func(a, b crdt.Record) int { return strings.Compare(a.Key, b.Key) })
	err := s.scanStored(prefix, func(r crdt.Record) {
		for len(held) > 0 && held[0].Key < r.Key {
			fn(held[0])
			held = held[1:]
		}
		if len(held) > 0 && held[0].Key == r.Key {
			if held[0].Wins(r) {
				r = held[0]
			}
			held = held[1:]
		}
		fn(r)
	})
	if err != nil {
		return err
	}
	for _, h := range held {
		fn(h)
	}
	return nil
}

// scanStored is scan of the records in badger. Called with s.mu held.
func (s *Store) scanStored(prefix string, fn func(crdt.Record)) error {
	return s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = []byte(recordPrefix + prefix)
		opts.PrefetchSize = 16
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			r, err := decodeItem(it.Item())
			if err != nil {
				return err
			}
			fn(r)
		}
		return nil
	})
}

// Purge deletes every tombstone that is crdt.Record.Expired at now for ttl
// and returns how many it deleted; see crdt.Record.Expired for how to choose
// ttl. A tombstone replaced by a newer write while Purge runs is kept.
// Deletions are committed in batches, so after an error some may have been
// done. Purge also lets badger reclaim value-log space. Errors wrap
// ErrCorrupt (naming the key; nothing is deleted then), ErrClosed, or a
// badger I/O error.
//
// While the filesystem is full nothing is purged: a delete is a write,
// and a held tombstone may hide a stored record that purging it would
// bring back. Held records are never purged (they are written first).
func (s *Store) Purge(now time.Time, ttl time.Duration) (int, error) {
	var expired [][]byte
	err := s.scan("", func(r crdt.Record) {
		if r.Expired(now, ttl) {
			expired = append(expired, []byte(recordPrefix+r.Key))
		}
	})
	if err != nil {
		return 0, fmt.Errorf("purge: %w", err)
	}
	if err := s.lock(); err != nil {
		return 0, err
	}
	defer s.mu.RUnlock()
	purged := 0
	if !s.checkSpace() {
		return 0, nil
	}
	for len(expired) > 0 {
		batch := expired[:min(purgeBatch, len(expired))]
		n, err := s.purgeBatch(batch, now, ttl)
		purged += n
		if n > 0 {
			s.notify()
		}
		if err != nil {
			return purged, fmt.Errorf("purge: %w", err)
		}
		expired = expired[len(batch):]
	}
	// Reclaim value-log files until badger finds nothing worth rewriting
	// (badger.ErrNoRewrite) or another GC runs (badger.ErrRejected); neither is a failure.
	for {
		if err := s.db.RunValueLogGC(vlogDiscardRatio); err != nil {
			break
		}
	}
	return purged, nil
}

// purgeBatch deletes the keys whose records are still expired tombstones, in
// one transaction retried on conflict.
func (s *Store) purgeBatch(keys [][]byte, now time.Time, ttl time.Duration) (int, error) {
	for attempt := 0; ; attempt++ {
		n := 0
		err := s.db.Update(func(txn *badger.Txn) error {
			for _, k := range keys {
				r, ok, err := getRecord(txn, k)
				if err != nil {
					return err
				}
				if !ok || !r.Expired(now, ttl) {
					continue // purged or overwritten meanwhile
				}
				if err := txn.Delete(k); err != nil {
					return fmt.Errorf("delete %q: %w", r.Key, err)
				}
				n++
			}
			return nil
		})
		if errors.Is(err, badger.ErrConflict) && attempt < maxConflictRetries {
			continue
		}
		if err != nil {
			return 0, err
		}
		return n, nil
	}
}

// GetMeta returns the node-local value stored under key by PutMeta; ok is
// false if there is none. Meta keys are a separate key space from record
// keys. Errors wrap ErrClosed or a badger I/O error.
func (s *Store) GetMeta(key string) (value []byte, ok bool, err error) {
	if err := s.lock(); err != nil {
		return nil, false, err
	}
	defer s.mu.RUnlock()
	err = s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte(metaPrefix + key))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		value, err = item.ValueCopy(nil)
		ok = err == nil
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("get meta %q: %w", key, err)
	}
	if ok && value == nil {
		value = []byte{} // ok with a nil value would read as "absent" to some callers
	}
	return value, ok, nil
}

// PutMeta stores value under the node-local key (non-empty), replacing any
// previous value, durably before return. Meta values are meant to be small
// (node identity, peer addresses, an HLC high-water mark); badger bounds them
// at about 1 MiB. Errors wrap ErrClosed, ErrNoSpace (the filesystem is
// full, see Space) or a badger I/O error.
func (s *Store) PutMeta(key string, value []byte) error {
	if key == "" {
		return errors.New("put meta: empty key")
	}
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	if !s.checkSpace() {
		return fmt.Errorf("put meta %q: %w", key, s.noSpace("put meta"))
	}
	v := append([]byte(nil), value...) // badger keeps the slice until commit
	if err := s.db.Update(func(txn *badger.Txn) error {
		return txn.Set([]byte(metaPrefix+key), v)
	}); err != nil {
		return fmt.Errorf("put meta %q: %w", key, err)
	}
	return nil
}

// DropRecords deletes every record (meta is kept). A node that was away
// longer than the tombstone TTL calls it before rejoining, so that objects
// deleted meanwhile (whose tombstones peers have purged) cannot come back
// from its stale copy. Errors wrap ErrClosed, ErrNoSpace (the filesystem
// is full, see Space; the records buffered in memory are dropped all the
// same) or a badger I/O error.
func (s *Store) DropRecords() error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	s.purgeBuffered(func(crdt.Record) bool { return true })
	if !s.checkSpace() {
		s.notify()
		return fmt.Errorf("drop records: %w", s.noSpace("drop records"))
	}
	if err := s.db.DropPrefix([]byte(recordPrefix)); err != nil {
		return fmt.Errorf("drop records: %w", err)
	}
	s.notify()
	return nil
}
