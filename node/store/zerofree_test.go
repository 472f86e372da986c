package store

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// fillInodes makes empty files in dir until the filesystem has no free
// inode.
func fillInodes(t *testing.T, dir string) {
	t.Helper()
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("inode-%d", i)))
		if err != nil {
			break
		}
		f.Close()
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Ffree != 0 {
		t.Fatalf("filled %s to %d free inodes (%v), want 0", dir, st.Ffree, err)
	}
}

func testRecord(clock *hlc.Clock, key, value string) crdt.Record {
	return crdt.Record{Key: key, Value: []byte(value), Version: clock.Now(), Origin: "n1"}
}

// openWithRecords opens the store in dir and writes n records
// deployment/default/web-<i> into it, versioned by clock.
func openWithRecords(t *testing.T, dir string, clock *hlc.Clock, n int) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := s.Apply(testRecord(clock, fmt.Sprintf("deployment/default/web-%d", i), `{"v":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// writeAndCrash writes records into a store in dir from a child process
// that exits without closing it (as a killed agent does): its memtable
// log is left longer than its last entry.
func writeAndCrash(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWriteAndExit$")
	cmd.Env = append(os.Environ(), "STORE_CRASH_DIR="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("writer: %v\n%s", err, out)
	}
}

// TestHelperWriteAndExit is writeAndCrash's child.
func TestHelperWriteAndExit(t *testing.T) {
	dir := os.Getenv("STORE_CRASH_DIR")
	if dir == "" {
		t.Skip("a helper of writeAndCrash")
	}
	openWithRecords(t, dir, hlc.New(nil), 20)
	os.Exit(0) // no Close
}

// TestStoreOpensOnAFilesystemWithNothingFree: the store of an agent
// restarted on a filesystem with exactly 0 bytes free (its ballast gone
// in an earlier run), or no free inode, opens (badger read-only: its
// read-write open wrote through mmap and died of SIGBUS), serves what it
// holds, holds new records in memory and says it is full; when space
// returns it reopens for writing by itself and writes what it held.
func TestStoreOpensOnAFilesystemWithNothingFree(t *testing.T) {
	for _, tc := range []struct {
		name    string
		crashed bool
		inodes  bool
	}{
		{"closed, 0 bytes free", false, false},
		{"closed, no free inode", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := smallDisk(t, 200, "nr_inodes=2000")
			dir := filepath.Join(fs, "store")
			clock := hlc.New(nil)
			if tc.crashed {
				writeAndCrash(t, dir)
			} else {
				s := openWithRecords(t, dir, clock, 20)
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			// The ballast went in an earlier run that found the disk full,
			// and the filler took its blocks too.
			if err := os.Remove(filepath.Join(dir, ballastName)); err != nil {
				t.Fatal(err)
			}
			free := func() {}
			if tc.inodes {
				fillInodes(t, fs)
			} else {
				free = fill(t, fs)
			}

			s, err := Open(dir)
			if err != nil {
				t.Fatalf("open on a full filesystem: %v", err)
			}
			if sp := s.Space(); !sp.Full || (!tc.inodes && sp.Free != 0) {
				t.Fatalf("space %+v, want full with 0 bytes free", sp)
			}
			if r, ok, err := s.Get("deployment/default/web-7"); err != nil || !ok || string(r.Value) != `{"v":1}` {
				t.Fatalf("a stored record on the full start: %v %v %v", r, ok, err)
			}
			if _, err := s.Apply(testRecord(clock, "deployment/default/new", `{"held":1}`)); err != nil {
				t.Fatalf("a record from a peer while full: %v", err)
			}
			if err := s.PutMeta("x", []byte("y")); !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("a meta write while full: %v, want ENOSPC", err)
			}

			// Space returns.
			if tc.inodes {
				matches, _ := filepath.Glob(filepath.Join(fs, "inode-*"))
				for _, m := range matches {
					os.Remove(m)
				}
			} else {
				free()
			}
			if sp := s.Space(); sp.Full || sp.Buffered != 0 {
				t.Fatalf("space %+v after space returned, want not full and nothing held", sp)
			}
			if _, err := s.Apply(testRecord(clock, "deployment/default/after", `{"w":1}`)); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s, err = Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for _, k := range []string{"deployment/default/web-7", "deployment/default/new", "deployment/default/after"} {
				if _, ok, err := s.Get(k); err != nil || !ok {
					t.Errorf("%s after the return of space and a reopen: %v %v", k, ok, err)
				}
			}
		})
	}
}

// TestStoreNotClosedOnAFullFilesystemFailsWithTheFix: a store left open
// (the agent killed) on a filesystem with 0 bytes free cannot be opened
// read-only (badger must cut its memtable log first, which needs room):
// Open fails with an error that names the full filesystem, the unclean
// stop and the space to free, instead of a SIGBUS; with the space freed
// it opens and holds what was written before the kill.
func TestStoreNotClosedOnAFullFilesystemFailsWithTheFix(t *testing.T) {
	fs := smallDisk(t, 200)
	dir := filepath.Join(fs, "store")
	writeAndCrash(t, dir)
	if err := os.Remove(filepath.Join(dir, ballastName)); err != nil {
		t.Fatal(err)
	}
	free := fill(t, fs)
	_, err := Open(dir)
	for _, want := range []string{"full (0.0 MiB free)", "not closed cleanly", "free 160.0 MiB"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("open after a kill on a full filesystem: %v, want an error with %q", err, want)
		}
	}
	free()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok, err := s.Get("deployment/default/web-7"); err != nil || !ok {
		t.Fatalf("a record written before the kill: %v %v", ok, err)
	}
}

// TestStoreClosesAndOpensAfterFillingToZeroWhileRunning: the filesystem
// fills while the store runs (it drops its ballast so badger's work in
// flight finds room), then another writer takes those blocks too, to
// exactly 0 bytes free. Close still flushes badger's memtable (into the
// reserve it drops then; it died of SIGBUS), the store opens again at 0
// bytes free with everything written before, and resumes once space
// returns.
func TestStoreClosesAndOpensAfterFillingToZeroWhileRunning(t *testing.T) {
	fs := smallDisk(t, 250)
	dir := filepath.Join(fs, "store")
	s := openWithRecords(t, dir, hlc.New(nil), 200)
	first := fill(t, fs)
	if sp := s.Space(); !sp.Full {
		t.Fatalf("space %+v, want full", sp)
	}
	second := fill(t, fs, "filler2") // the ballast's blocks
	if err := s.Close(); err != nil {
		t.Fatalf("close at 0 bytes free: %v", err)
	}
	third := fill(t, fs, "filler3") // the reserve's blocks
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("open at 0 bytes free after the close: %v", err)
	}
	if rs, err := s.List("deployment/"); err != nil || len(rs) != 200 {
		t.Fatalf("records after the close and open at 0 bytes free: %d, %v; want 200", len(rs), err)
	}
	for _, free := range []func(){first, second, third} {
		free()
	}
	if sp := s.Space(); sp.Full {
		t.Fatalf("space %+v after space returned", sp)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
