package store

import (
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// smallDisk mounts a tmpfs of size MiB on a fresh directory and returns
// smallDisk mounts a tmpfs of size MiB (opts: more mount options, such
// as "nr_inodes=2000") for the test, removed at its end. It needs root.
func smallDisk(t *testing.T, size int, opts ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small filesystem needs root")
	}
	dir := t.TempDir()
	o := strings.Join(append([]string{fmt.Sprintf("size=%dm", size), "mode=0700"}, opts...), ",")
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, o); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes file name in dir until the filesystem has exactly 0 bytes
// free (statfs f_bavail 0), and returns a function that removes it.
func fill(t *testing.T, dir string, name ...string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, append(name, "filler")[0])
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for n := len(buf); n >= 1; n /= 2 {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("filling %s: %v", dir, err)
				}
				break
			}
		}
	}
	f.Close()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Bavail != 0 {
		t.Fatalf("filled %s to %d free blocks (%v), want 0", dir, st.Bavail, err)
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
}

// value is a JSON string of about n bytes.
func value(i, n int) string {
	return fmt.Sprintf("%q", fmt.Sprintf("%06d", i)+strings.Repeat("x", n))
}

// storeOnSmallDisk opens a store in the directory store of a fresh
// 200 MiB smallDisk and writes n records cm/<group>/<i> of about size
// bytes into it.
func storeOnSmallDisk(t *testing.T, group string, n, size int) (disk, dir string, s *Store) {
	t.Helper()
	disk = smallDisk(t, 200)
	dir = filepath.Join(disk, "store")
	s = open(t, dir)
	for i := range n {
		mustApply(t, s, rec(fmt.Sprintf("cm/%s/%d", group, i), int64(i+1), "n1", value(i, size)), true)
	}
	return disk, dir, s
}

// A full disk used to crash the process with SIGBUS inside badger (its
// memtable is a sparse file written through mmap), on the first write and
// again after every restart. Now the store writes nothing to disk below
// MinFree: records are buffered in memory (reads see them) up to a bound,
// meta writes and writes past the bound are refused with an error that
// names the directory and ENOSPC, and everything resumes by itself once
// space returns.
func TestFullDiskHoldsWritesAndRecovers(t *testing.T) {
	disk, dir, s := storeOnSmallDisk(t, "before", 20, 4096)
	if _, err := os.Stat(filepath.Join(dir, ballastName)); err != nil {
		t.Fatalf("no ballast file: %v", err)
	}
	free := fill(t, disk)

	// 2000 x 8 KiB: badger would write far past its memtable file's
	// first blocks.
	for i := range 2000 {
		mustApply(t, s, rec(fmt.Sprintf("cm/during/%d", i), int64(i+1), "n1", value(i, 8192)), true)
	}
	if st := s.Space(); !st.Full || st.Dir != dir || st.Buffered != 2000 {
		t.Errorf("Space() = %+v, want Full in %s with 2000 buffered", st, dir)
	}
	if r := mustGet(t, s, "cm/during/1999"); !strings.Contains(string(r.Value), "001999") {
		t.Errorf("buffered record read back as %.20s", r.Value)
	}
	if rs, err := s.List("cm/"); err != nil || len(rs) != 2020 {
		t.Errorf("List(cm/) = %d records, %v; want 2020", len(rs), err)
	}
	// The CRDT rule holds for buffered records too.
	mustApply(t, s, rec("cm/during/5", 1, "n1", value(0, 10)), false)
	mustApply(t, s, rec("cm/before/5", 1, "n1", value(0, 10)), false)

	err := s.PutMeta("k", []byte("v"))
	if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), dir) {
		t.Errorf("PutMeta on a full disk: %v, want ErrNoSpace, ENOSPC and the directory named", err)
	}
	// Past the bound, writes are refused, and nothing is lost.
	var refused error
	for i := range 10000 { // 80 MiB
		if _, err := s.Apply(rec(fmt.Sprintf("cm/more/%d", i), int64(i+1), "n1", value(i, 8192))); err != nil {
			refused = err
			break
		}
	}
	if !errors.Is(refused, ErrNoSpace) || !errors.Is(refused, syscall.ENOSPC) || !strings.Contains(refused.Error(), dir) {
		t.Fatalf("write past the memory bound on a full disk: %v, want ErrNoSpace, ENOSPC and the directory named", refused)
	}
	t.Logf("refused: %v", refused)
	if rs, _ := s.List("cm/before/"); len(rs) != 20 {
		t.Errorf("List(cm/before/) = %d records, want 20", len(rs))
	}

	// Restart while the disk is full: Close and Open work; what was
	// buffered is gone (peers send it again), what was stored stays.
	if err := s.Close(); err != nil {
		t.Fatalf("Close on a full disk: %v", err)
	}
	s = open(t, dir)
	if st := s.Space(); !st.Full {
		t.Fatalf("Space() after a restart on a full disk = %+v, want Full", st)
	}
	if rs, _ := s.List("cm/before/"); len(rs) != 20 {
		t.Errorf("after a restart: %d records under cm/before/, want 20", len(rs))
	}
	mustApply(t, s, rec("cm/x/after-restart", 1, "n1", value(0, 100)), true)

	// Space returns: the next check writes what is buffered and resumes.
	free()
	if st := s.Space(); st.Full || st.Buffered != 0 {
		t.Errorf("Space() after space returned = %+v, want not full, nothing buffered", st)
	}
	for i := range 200 {
		mustApply(t, s, rec(fmt.Sprintf("cm/after/%d", i), int64(i+1), "n1", value(i, 8192)), true)
	}
	if err := s.PutMeta("k", []byte("v")); err != nil {
		t.Errorf("PutMeta after space returned: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	for p, want := range map[string]int{"cm/before/": 20, "cm/after/": 200, "cm/x/": 1} {
		if rs, err := s.List(p); err != nil || len(rs) != want {
			t.Errorf("after reopen: List(%s) = %d records, %v; want %d", p, len(rs), err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ballastName)); err != nil {
		t.Errorf("ballast not made again: %v", err)
	}
}

// A filesystem filled to the last block while the store was idle: Close
// flushes badger's memtable, which needs blocks; the store drops its
// ballast first. Open then starts full, and the memtable's records are
// all there.
func TestCloseAndOpenOnAFilesystemFilledWhileIdle(t *testing.T) {
	disk, dir, s := storeOnSmallDisk(t, "idle", 500, 8192)
	free := fill(t, disk)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s = open(t, dir)
	if st := s.Space(); !st.Full {
		t.Errorf("Space() = %+v, want Full", st)
	}
	if rs, err := s.List("cm/idle/"); err != nil || len(rs) != 500 {
		t.Errorf("List = %d records, %v; want 500", len(rs), err)
	}
	free()
	if st := s.Space(); st.Full {
		t.Errorf("Space() after space returned = %+v", st)
	}
}

// Records buffered by a write that raced with the return of space (the
// store was found not full between its check and its hold) are written
// by the next check, not kept in memory for ever.
func TestRecordsBufferedAcrossTheReturnOfSpaceAreWritten(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	free := uint64(10 << 30)
	s.statfs = func(string) (uint64, error) { return free, nil }
	free = 1 << 20
	mustApply(t, s, rec("cm/a/x", 1, "n1", value(1, 10)), true)
	if st := s.Space(); !st.Full || st.Buffered != 1 {
		t.Fatalf("Space() = %+v, want full with 1 buffered", st)
	}
	// The race: space is back and the store marked not full while a
	// record is still buffered.
	free = 10 << 30
	s.spaceMu.Lock()
	s.full = false
	s.spaceMu.Unlock()
	if st := s.Space(); st.Full || st.Buffered != 0 {
		t.Fatalf("Space() = %+v, want not full, nothing buffered", st)
	}
	if r, ok, err := s.getStored("cm/a/x"); err != nil || !ok || !strings.Contains(string(r.Value), "000001") {
		t.Fatalf("the buffered record is not on disk: %v %v %s", ok, err, r.Value)
	}
}
