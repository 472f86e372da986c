package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// With its data directory's filesystem full, an agent used to die of
// SIGBUS inside badger on its next write, and again at every restart
// until space was freed; nothing named the disk. Now it keeps running its
// replicas and following the cluster, refuses API writes with an error
// that names the data directory and ENOSPC, shows the condition in get
// nodes (on every node) and /metrics, starts again while full, and
// resumes by itself once space returns.
func TestFullDataDirectoryRefusesWritesAndRecovers(t *testing.T) {
	t.Parallel() // long and mostly waiting: runs beside another such test
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	importEcho(t, n1)
	apply(t, n1, deployment("full-a", 2, "a"))
	waitFor(t, 60*time.Second, func() error { _, err := readyOnePerNode(n1, "full-a", 2); return err })

	// n2's store moves to a 200 MiB filesystem of its own.
	n2.KillAgent(syscall.SIGTERM)
	small := filepath.Join(n2.Dir, "small")
	storeDir := filepath.Join(n2.DataDir, "store")
	if err := os.MkdirAll(small, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", small, "tmpfs", 0, "size=200m,nr_inodes=4096,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(small, syscall.MNT_DETACH) })
	if out, err := exec.Command("cp", "-a", storeDir, small+"/").CombinedOutput(); err != nil {
		t.Fatalf("copy the store: %v: %s", err, out)
	}
	if err := os.RemoveAll(storeDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(small, "store"), storeDir); err != nil {
		t.Fatal(err)
	}
	if err := n2.RestartAgent(); err != nil {
		t.Fatal(err)
	}

	fill, free := fillFilesystem(t, small)
	fill()
	nodeState := func(from *harness.Node, want bool) error {
		out, err := from.CLI("get", "nodes", n2.Name, "-o", "json")
		if err != nil {
			return err
		}
		var l struct{ Items []struct{ DiskFull bool } }
		if err := json.Unmarshal([]byte(out), &l); err != nil || len(l.Items) != 1 {
			return fmt.Errorf("get nodes %s from %s: %v: %s", n2.Name, from.Name, err, out)
		}
		if l.Items[0].DiskFull != want {
			return fmt.Errorf("get nodes from %s: %s diskFull %v, want %v", from.Name, n2.Name, l.Items[0].DiskFull, want)
		}
		return nil
	}
	storeFull := func(want float64) error {
		m, err := metrics(n2)
		if err != nil {
			return err
		}
		if m["starling_store_full"] != want {
			return fmt.Errorf("%s: starling_store_full %v, want %v", n2.Name, m["starling_store_full"], want)
		}
		return nil
	}
	// shown says whether n2's /metrics and get nodes on both nodes say
	// n2's data directory is full (or not).
	shown := func(full bool) error {
		want := 0.0
		if full {
			want = 1
		}
		if err := storeFull(want); err != nil {
			return err
		}
		if err := nodeState(n2, full); err != nil {
			return err
		}
		return nodeState(n1, full)
	}
	took, err := eventually(15*time.Second, func() error { return shown(true) })
	if err != nil {
		t.Fatalf("full data directory not reported: %v\n%s", err, n2.Tail(20))
	}
	t.Logf("full data directory shown in get nodes on both nodes and in /metrics after %v", took.Round(time.Millisecond))
	if out, _ := n1.CLI("get", "nodes"); !strings.Contains(out, "disk-full") {
		t.Errorf("get nodes does not say disk-full:\n%s", out)
	}

	// An API write to n2 is refused, and names the directory and ENOSPC.
	_, err = n2.CLIInput(strings.NewReader(deployment("full-refused", 1, "x")), "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), "ENOSPC") || !strings.Contains(err.Error(), storeDir) {
		t.Fatalf("apply on the full node: %v, want an error naming %s and ENOSPC", err, storeDir)
	}
	t.Logf("refused: %v", err)

	// n2 keeps following the cluster and running replicas: a Deployment
	// written through n1 gets its replica on n2 too, and the replica
	// that ran before answers.
	apply(t, n1, deployment("full-b", 2, "b"))
	var before map[string]replica
	waitFor(t, 60*time.Second, func() error {
		if _, err := readyOnePerNode(n2, "full-b", 2); err != nil {
			return err
		}
		var err error
		before, err = readyOnePerNode(n1, "full-a", 2)
		return err
	})
	if _, err := harness.HTTPGet(n1.NetNS, "http://"+before[n2.Name].PodIP+":8080/", 2*time.Second); err != nil {
		t.Errorf("the replica on the full node does not answer: %v", err)
	}

	// A restart while full to the last byte: the agent starts (it used
	// to crash at every start, and with a Go runtime crash inside
	// badger.Open when 0 bytes were left), and still says it is full.
	// What the stopping agent gives back (badger's preallocated files)
	// is filled too, so the restart meets exactly 0 bytes free.
	restartWhileFull := func(what string) {
		t.Helper()
		n2.KillAgent(syscall.SIGTERM)
		fill()
		if err := n2.RestartAgent(); err != nil {
			t.Fatalf("restart with %s: %v\n%s", what, err, n2.Tail(30))
		}
		// n2's own view: the record on its disk predates the fill, so
		// only a status published by the restarted agent says full.
		waitFor(t, 15*time.Second, func() error {
			if err := storeFull(1); err != nil {
				return err
			}
			return nodeState(n2, true)
		})
		waitFor(t, 30*time.Second, func() error { _, err := readyOnePerNode(n2, "full-b", 2); return err })
		t.Logf("restarted with %s: starts, says full, keeps its replicas", what)
	}
	restartWhileFull("0 bytes free")

	// Space returns, then inodes run out: full too (badger makes files
	// as it writes), and a restart then starts as well.
	free()
	waitFor(t, 15*time.Second, func() error { return storeFull(0) })
	fill = func() { exhaustInodes(t, small) }
	restartWhileFull("no inode free")

	// Space returns: writes resume by themselves.
	free()
	took, err = eventually(15*time.Second, func() error { return shown(false) })
	if err != nil {
		t.Fatalf("space returned: %v", err)
	}
	t.Logf("space returned: shown in get nodes on both nodes and in /metrics after %v", took.Round(time.Millisecond))
	apply(t, n2, deployment("full-c", 2, "c"))
	waitFor(t, 60*time.Second, func() error { _, err := readyOnePerNode(n1, "full-c", 2); return err })

	logAll, _ := os.ReadFile(n2.AgentLogPath())
	for _, bad := range []string{"SIGBUS", "fatal error", "panic:"} {
		if strings.Contains(string(logAll), bad) {
			t.Errorf("%s's log holds %q", n2.Name, bad)
		}
	}
}

// fillFilesystem returns fill, which writes to a file in dir until its
// filesystem has exactly 0 bytes free (statfs f_bavail 0; it can be
// called again to take what was given back since), and free, which
// removes what fill and exhaustInodes made.
func fillFilesystem(t *testing.T, dir string) (fill, free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	fill = func() {
		t.Helper()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 1<<20)
		for n := len(buf); n >= 1; n /= 2 {
			for {
				if _, err := f.Write(buf[:n]); err != nil {
					if !errors.Is(err, syscall.ENOSPC) {
						t.Fatalf("fill %s: %v", dir, err)
					}
					break
				}
			}
		}
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		if st.Bavail != 0 {
			t.Fatalf("fill %s: %d blocks still free", dir, st.Bavail)
		}
	}
	free = func() {
		t.Helper()
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, "inodes")); err != nil {
			t.Fatal(err)
		}
	}
	return fill, free
}

// exhaustInodes makes empty files in dir until its filesystem has no
// inode free (statfs f_ffree 0).
func exhaustInodes(t *testing.T, dir string) {
	t.Helper()
	sub := filepath.Join(dir, "inodes")
	if err := os.MkdirAll(sub, 0o700); err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(sub, fmt.Sprint(i)))
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("exhaust inodes in %s: %v", dir, err)
			}
			break
		}
		f.Close()
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Ffree != 0 {
		t.Fatalf("exhaust inodes in %s: %d still free", dir, st.Ffree)
	}
}
