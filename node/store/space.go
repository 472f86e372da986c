package store

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	badger "github.com/dgraph-io/badger/v4"
	"golang.org/x/sys/unix"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// A full filesystem must not crash the node. badger writes its memtable
// and its tables through mmap of files it created sparse, so a write that
// finds no free block ends in SIGBUS, a fatal fault (not an error), in
// badger's own goroutines, and again at every restart while the replay
// of the memtable is flushed. The store therefore never lets badger write
// below MinFree bytes free, and keeps a ballast file that it deletes when
// the filesystem fills, so that what badger has started (a flush, a
// compaction, the replay at open, the flush at close) finds room even
// when another writer (container logs, images) took every block. This is
// CockroachDB's ballast (cockroach debug ballast), sized for badger as
// configured in badgerOptions.
const (
	// MinFree is the free space (bytes, statfs f_bavail) below which the
	// store stops writing to disk: a new memtable file (2 x 16 MiB, badger
	// writes it through mmap) and the flush of the current one (16 MiB).
	MinFree = 64 << 20
	// BallastSize is the size of the ballast file (bytes): room for
	// badger to flush both memtables and compact once.
	BallastSize = 64 << 20
	// maxBufferedBytes bounds the encoded records buffered in memory while the
	// filesystem is full; past it Apply fails with ErrNoSpace.
	maxBufferedBytes = 64 << 20
	// ReserveSize is the size of the reserve file (bytes): room for
	// badger's flush at Close once the ballast is gone and another writer
	// took its blocks too (the filesystem at exactly 0 bytes free).
	ReserveSize = 32 << 20
	// ResumeFree is the free space (bytes) at which a full store writes
	// again: MinFree, with room to make the ballast and the reserve.
	ResumeFree = MinFree + BallastSize + ReserveSize
	// ballastName and reserveName are the files' names in the store's
	// directory.
	ballastName = "ballast"
	reserveName = "reserve"
)

// ErrNoSpace: the filesystem that holds the store is full (below MinFree
// bytes free), so the store does not write to disk. Errors that wrap it
// are *NoSpaceError and also match syscall.ENOSPC.
var ErrNoSpace = errors.New("no space left on device")

// NoSpaceError is returned (wrapped) when the store does not write
// because its filesystem is full.
type NoSpaceError struct {
	// Op is what was refused ("put meta", "drop records", "hold records").
	Op string
	// Dir is the store's directory.
	Dir string
	// Free is the free space found (bytes).
	Free uint64
}

func (e *NoSpaceError) Error() string {
	return fmt.Sprintf("%s: the filesystem of data directory %s is full (ENOSPC: %s free; the store writes again once %s are free); free space there (container logs, images, other files) and writes resume by themselves",
		e.Op, e.Dir, mib(e.Free), mib(ResumeFree))
}

// Is makes errors.Is(err, ErrNoSpace) and errors.Is(err, syscall.ENOSPC)
// true.
func (e *NoSpaceError) Is(target error) bool {
	return target == ErrNoSpace || target == syscall.ENOSPC
}

// mib prints n bytes in MiB, one decimal.
func mib(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// Space is the state of the filesystem that holds the store.
type Space struct {
	// Dir is the store's directory.
	Dir string
	// Free is the free space found at the last check (bytes, statfs
	// f_bavail x f_bsize; the ballast, when present, is not free).
	Free uint64
	// Full: the store does not write to disk. It became full when Free
	// fell below MinFree, and stays full until MinFree plus BallastSize
	// are free, so that it can put its ballast back.
	Full bool
	// Buffered is how many records are buffered in memory only, written to disk
	// once the filesystem has room again (lost if the process stops
	// before: peers send them again, as after any restart).
	Buffered int
}

// freeBytes returns the free space of the filesystem holding dir.
func freeBytes(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	// Out of inodes is full too: badger makes files (a memtable, tables,
	// a value log) as it writes. A filesystem that makes inodes as it
	// needs them (btrfs) reports no inode count at all.
	if st.Files > 0 && st.Ffree < minFreeInodes {
		return 0, nil
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// minFreeInodes is the free inodes below which the store's filesystem
// counts as full: badger makes a few files per flush and compaction.
const minFreeInodes = 64

// Space checks the free space of the store's filesystem now (one statfs),
// changes state if it crossed a threshold, and returns the state. Calling
// it periodically lets the store drop its ballast and resume writes
// without waiting for a write.
func (s *Store) Space() Space {
	if s.lock() != nil {
		return Space{Dir: s.dir}
	}
	s.checkSpace()
	sp, reopen := s.spaceState(), s.readOnly && s.roomToReopen()
	s.mu.RUnlock()
	if reopen && s.reopen() {
		return s.Space()
	}
	return sp
}

func (s *Store) spaceState() Space {
	s.spaceMu.Lock()
	defer s.spaceMu.Unlock()
	s.bufMu.Lock()
	defer s.bufMu.Unlock()
	return Space{Dir: s.dir, Free: s.free, Full: s.full, Buffered: len(s.buffered)}
}

// checkSpace updates s.full from the free space and reports whether the
// store may write to disk. On the way to full it deletes the ballast; on
// the way back it re-creates the ballast and writes the buffered records.
// Called with s.mu held (shared).
func (s *Store) checkSpace() bool {
	s.spaceMu.Lock()
	defer s.spaceMu.Unlock()
	free, err := s.statfs(s.dir)
	if err != nil {
		// Not knowing is not full: badger reports real I/O errors.
		return !s.full
	}
	s.free = free
	switch {
	case !s.full && free >= MinFree && s.bufferedCount() > 0:
		// Records buffered by a write that raced with the return of space,
		// or left by a failed writeBuffered: written now.
		if _, err := s.writeBuffered(); err != nil {
			s.log.Error("writing the records buffered in memory failed; they stay buffered", "err", err)
		}
	case !s.full && free < MinFree:
		s.full = true
		s.dropBallast()
		s.log.Error("the data directory's filesystem is full: the store writes nothing to disk and holds records from peers in memory; writes through the API are refused until space returns",
			"free", mib(free), "resumes at", mib(ResumeFree))
	case s.full && s.readOnly:
		// Opened read-only on a full filesystem: Space reopens badger
		// for writing once there is room (reopen), which needs mu held
		// exclusively.
	case s.full && free >= ResumeFree:
		if err := s.makeBallast(); err != nil {
			s.log.Warn("space returned but the ballast file cannot be made; the store stays full", "err", err)
			return false
		}
		s.full = false
		s.free, _ = s.statfs(s.dir)
		n, err := s.writeBuffered()
		if err != nil {
			s.log.Error("space returned but writing the records buffered in memory failed; they stay buffered", "err", err)
		}
		s.log.Info("the data directory's filesystem has room again: the store writes to disk", "free", mib(s.free), "buffered records written", n)
	}
	return !s.full
}

// openSpace sets the initial state before badger opens: with less than
// MinFree free (counting the ballast as free) the store starts full and
// deletes its ballast first, so that badger's replay finds room.
func (s *Store) openSpace() {
	free, err := s.statfs(s.dir)
	if err != nil {
		return
	}
	ballast := int64(0)
	if st, err := os.Stat(filepath.Join(s.dir, ballastName)); err == nil {
		ballast = st.Size()
	}
	switch {
	case ballast > 0 && free < MinFree:
		s.full = true
		s.dropBallast()
	case ballast == 0 && free >= ResumeFree:
		if err := s.makeBallast(); err != nil {
			s.log.Warn("cannot make the ballast file", "err", err)
		}
	case ballast == 0:
		s.full = true
	default:
		// A store made before the reserve: made now if there is room.
		if _, err := os.Stat(filepath.Join(s.dir, reserveName)); errors.Is(err, os.ErrNotExist) && free >= MinFree+ReserveSize {
			if err := allocate(filepath.Join(s.dir, reserveName), ReserveSize); err != nil {
				s.log.Warn("cannot make the reserve file", "err", err)
			}
		}
	}
	s.free, _ = s.statfs(s.dir)
	if s.full {
		s.log.Error("the data directory's filesystem is full at start: the store writes nothing to disk until space returns",
			"free", mib(s.free), "resumes at", mib(ResumeFree))
	}
}

// makeBallast allocates the ballast file and the reserve file (unless
// it exists).
func (s *Store) makeBallast() error {
	if err := allocate(filepath.Join(s.dir, ballastName), BallastSize); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(s.dir, reserveName)); err == nil {
		return nil
	}
	return allocate(filepath.Join(s.dir, reserveName), ReserveSize)
}

// allocate makes file path of size bytes (fallocate, so its blocks are
// taken now, not when written; zeros written where the filesystem has no
// fallocate, as ZFS before 2.2 or NFSv3).
func allocate(path string, size int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, int64(size))
	if errors.Is(err, unix.EOPNOTSUPP) {
		err = writeZeros(f, size)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// writeZeros writes n zero bytes to f and syncs it.
func writeZeros(f *os.File, n int) error {
	buf := make([]byte, 1<<20)
	for n > 0 {
		k, err := f.Write(buf[:min(n, len(buf))])
		if err != nil {
			return err
		}
		n -= k
	}
	return f.Sync()
}

// dropReserve deletes the reserve file: Close does, on a full filesystem,
// so that badger's flush of its memtable finds room.
func (s *Store) dropReserve() {
	if err := os.Remove(filepath.Join(s.dir, reserveName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("cannot remove the reserve file", "err", err)
	}
}

func (s *Store) dropBallast() {
	if err := os.Remove(filepath.Join(s.dir, ballastName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("cannot remove the ballast file", "err", err)
	}
}

// noSpace is the error for op refused on a full filesystem.
func (s *Store) noSpace(op string) error {
	s.spaceMu.Lock()
	defer s.spaceMu.Unlock()
	return &NoSpaceError{Op: op, Dir: s.dir, Free: s.free}
}

// hold applies rs (encoded as enc) to the records buffered in memory, with
// the CRDT rule against both the buffered and the stored record of each key.
// All or nothing: past maxBufferedBytes it holds nothing and fails with a
// *NoSpaceError.
func (s *Store) hold(rs []crdt.Record, enc [][]byte) ([]crdt.Record, error) {
	size := 0
	for _, b := range enc {
		size += len(b)
	}
	w, over, err := s.tryHold(rs, enc, size)
	if over > 0 {
		// s.noSpace takes s.spaceMu, which is never taken inside s.bufMu.
		return nil, s.noSpace(fmt.Sprintf("hold %d records in memory (%s buffered already)", len(rs), mib(uint64(over))))
	}
	return w, err
}

// tryHold is hold under s.bufMu; when the records do not fit it holds
// nothing and returns the bytes buffered already as over.
func (s *Store) tryHold(rs []crdt.Record, enc [][]byte, size int) (written []crdt.Record, over int, err error) {
	s.bufMu.Lock()
	defer s.bufMu.Unlock()
	if s.bufBytes+size > maxBufferedBytes {
		return nil, max(s.bufBytes, 1), nil
	}
	for i, r := range rs {
		cur, ok := s.buffered[r.Key]
		if !ok {
			var err error
			if cur, ok, err = s.getStored(r.Key); err != nil {
				return nil, 0, err
			}
		}
		if ok && !r.Wins(cur) {
			continue
		}
		if old, ok := s.bufSize[r.Key]; ok {
			s.bufBytes -= old
		}
		r.Value, r.Signer, r.Sig = slices.Clone(r.Value), slices.Clone(r.Signer), slices.Clone(r.Sig)
		s.buffered[r.Key] = r
		s.bufSize[r.Key] = len(enc[i])
		s.bufBytes += len(enc[i])
		if j := slices.IndexFunc(written, func(w crdt.Record) bool { return w.Key == r.Key }); j >= 0 {
			written[j] = r
		} else {
			written = append(written, r)
		}
	}
	return written, 0, nil
}

// writeBuffered writes the buffered records to disk (the CRDT rule applies, as
// for any write) and forgets them; it returns how many it wrote.
// Called with s.mu held (shared) and s.spaceMu.
func (s *Store) writeBuffered() (int, error) {
	s.bufMu.Lock()
	defer s.bufMu.Unlock()
	keys := slices.Sorted(maps.Keys(s.buffered))
	written := 0
	for len(keys) > 0 {
		// Batches well below one transaction's limit (ErrBatchTooLarge).
		var rs []crdt.Record
		var enc [][]byte
		size := 0
		for len(keys) > 0 && (len(rs) == 0 || size+s.bufSize[keys[0]] < 1<<20) {
			r := s.buffered[keys[0]]
			b, err := crdt.EncodeRecord(r)
			if err != nil {
				return written, err
			}
			rs, enc, size = append(rs, r), append(enc, b), size+len(b)
			keys = keys[1:]
		}
		w, err := s.applyDisk(rs, enc)
		if err != nil {
			return written, err
		}
		written += len(w)
		for _, r := range rs {
			delete(s.buffered, r.Key)
			s.bufBytes -= s.bufSize[r.Key]
			delete(s.bufSize, r.Key)
		}
	}
	return written, nil
}

func (s *Store) bufferedCount() int {
	s.bufMu.Lock()
	defer s.bufMu.Unlock()
	return len(s.buffered)
}

// bufferedRecord returns the record buffered in memory for key, if any.
func (s *Store) bufferedRecord(key string) (crdt.Record, bool) {
	s.bufMu.Lock()
	defer s.bufMu.Unlock()
	r, ok := s.buffered[key]
	return r, ok
}

// bufferedWithPrefix returns the buffered records whose key starts with prefix.
func (s *Store) bufferedWithPrefix(prefix string) []crdt.Record {
	s.bufMu.Lock()
	defer s.bufMu.Unlock()
	var out []crdt.Record
	for k, r := range s.buffered {
		if strings.HasPrefix(k, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// purgeBuffered deletes the buffered tombstones expired for ttl at now.
func (s *Store) purgeBuffered(expired func(crdt.Record) bool) int {
	s.bufMu.Lock()
	defer s.bufMu.Unlock()
	n := 0
	for k, r := range s.buffered {
		if expired(r) {
			delete(s.buffered, k)
			s.bufBytes -= s.bufSize[k]
			delete(s.bufSize, k)
			n++
		}
	}
	return n
}

// openFull opens badger read-only in dir, on a filesystem found full at
// Open (free bytes free): reads work, nothing is written, and the store
// holds writes in memory until reopen. badger refuses a read-only open of
// a store that was not closed (a killed agent, a power cut: its memtable
// log is longer than its last entry, and cutting it needs a read-write
// open, which needs room); that start fails with an error that says so,
// not with a SIGBUS.
func openFull(dir string, free uint64, log *slog.Logger) (*badger.DB, error) {
	// A memtable log is left only by a store that was not closed, and its
	// read-only open always fails (the log is preallocated past its last
	// entry), after reading it through mmap, which on a full tmpfs is a
	// SIGBUS too (a read of a hole allocates a page there): not tried.
	var err error
	var db *badger.DB
	if logs, _ := filepath.Glob(filepath.Join(dir, "*.mem")); len(logs) > 0 {
		err = fmt.Errorf("memtable log %s left: end offset: unknown", filepath.Base(logs[0]))
	} else {
		db, err = badger.Open(badgerOptions(dir, log).WithReadOnly(true))
	}
	switch {
	case err == nil:
		log.Error("the data directory's filesystem is full at start: the store is open read-only and writes nothing to disk until space returns",
			"free", mib(free), "resumes at", mib(ResumeFree))
		return db, nil
	case strings.Contains(err.Error(), "end offset:"):
		// badger's ErrTruncateNeeded, wrapped without %w (badger's y.Wrapf).
		return nil, fmt.Errorf("open store %s: the filesystem of the data directory is full (%s free) and the store was not closed cleanly (the agent was killed or the machine lost power), so it can be opened only for writing, which needs room: free %s there (container logs, images, other files) and start again: %w",
			dir, mib(free), mib(ResumeFree), err)
	case errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "anifest"):
		return nil, fmt.Errorf("open store %s: the filesystem of the data directory is full (%s free) and the store was never written; a first start needs %s free: free space there or point --data-dir at a larger filesystem: %w",
			dir, mib(free), mib(ResumeFree), err)
	default:
		return nil, fmt.Errorf("open store %s read-only on a full filesystem (%s free): %w; free %s there and start again",
			dir, mib(free), err, mib(ResumeFree))
	}
}

// roomToReopen reports whether a store opened read-only on a full
// filesystem has room to write again. Called with s.mu held (shared).
func (s *Store) roomToReopen() bool {
	s.spaceMu.Lock()
	defer s.spaceMu.Unlock()
	return s.free >= ResumeFree
}

// reopen opens badger for writing in place of the read-only open of a
// full start, once there is room, and reports whether it did; the next
// checkSpace makes the ballast and writes the records buffered meanwhile.
// On failure the store stays read-only.
func (s *Store) reopen() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !s.readOnly {
		return false
	}
	log := slog.Default().With("component", "badger", "dir", s.dir)
	if err := s.db.Close(); err != nil {
		s.log.Warn("close the read-only store to reopen it for writing", "err", err)
	}
	db, err := badger.Open(badgerOptions(s.dir, log))
	if err != nil {
		s.log.Error("space returned but the store cannot be reopened for writing; it stays read-only", "err", err)
		if s.db, err = openFull(s.dir, s.free, log); err != nil {
			// Neither: the store is unusable, as a closed one is.
			s.log.Error("the store cannot be reopened read-only either", "err", err)
			s.closed = true
			close(s.changed)
		}
		return false
	}
	s.db, s.readOnly = db, false
	s.log.Info("space returned: the store, opened read-only on a full filesystem, is open for writing again")
	return true
}
