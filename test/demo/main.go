// Command demo brings up a three-node Starling cluster in network
// namespaces on this machine and shows the product working: placement,
// Services (ClusterIP, NodePort, hairpin), failover of a cut-off node and
// a rolling update under its budget. It prints every check it makes and a
// summary, and exits 0 only if every check passed. `make demo` runs it;
// `make demo KEEP=1` leaves the cluster up; `make demo-down` (demo --down)
// removes whatever a run left behind.
//
// It needs root, containerd, runc, iproute2, iptables, the CNI plugins
// and busybox-static (make deps installs them). It never touches the root
// network namespace: every node, containerd and container lives in
// namespaces named stdemo-*, removed at the end, on failure and on Ctrl-C.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/starling-orchestrator/starling/test/harness"
)

// prefix names the demo's namespaces; fixed so that a later run and
// `make demo-down` find what an earlier run left.
const prefix = "stdemo-"

func main() {
	dir := flag.String("dir", "/var/tmp/starling-demo", "where the demo keeps node data and images (removed at the end)")
	down := flag.Bool("down", false, "only remove what a previous run left behind")
	keep := flag.Bool("keep", false, "leave the cluster running at the end (remove it with make demo-down)")
	binary := flag.String("binary", "", "starling binary to run (default: build one)")
	debs := flag.String("debs", "/var/cache/starling/test-debs", "Debian packages the key-value store's image is built from (make deps downloads them)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: must run as root (it creates network namespaces and runs containerd)")
		os.Exit(1)
	}
	if err := harness.Down(*dir, prefix); err != nil {
		fmt.Fprintln(os.Stderr, "demo: cleaning up a previous run:", err)
	}
	os.Remove(diagnosticsPath(*dir))
	if *down {
		fmt.Println("demo: removed", *dir, "and namespaces", prefix+"*")
		return
	}

	// Ctrl-C (or SIGTERM) removes everything, KEEP or not: the cluster
	// the signal interrupted is not one to keep.
	var cluster atomic.Pointer[harness.Cluster]
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		// From here the scenario's output is dropped and its end waits
		// for this clean-up to exit.
		interrupted.Store(true)
		fmt.Println("\ninterrupted: removing the demo cluster ...")
		if c := cluster.Load(); c != nil {
			c.Close()
		}
		harness.Down(*dir, prefix)
		os.Exit(130)
	}()

	s := &scenario{dir: *dir, binary: *binary, debs: *debs, keep: *keep, onCluster: func(c *harness.Cluster) { cluster.Store(c) }}
	code := s.run()
	if interrupted.Load() {
		select {} // the signal handler exits
	}
	os.Exit(code)
}

// interrupted is set by the signal handler.
var interrupted atomic.Bool

// quiet writes to w until the demo is interrupted.
type quiet struct{ w io.Writer }

func (q quiet) Write(p []byte) (int, error) {
	if interrupted.Load() {
		return len(p), nil
	}
	return q.w.Write(p)
}

// diagnosticsPath is where a failed run saves the nodes' logs and rules:
// beside dir, which the clean-up removes.
func diagnosticsPath(dir string) string { return dir + "-diagnostics.txt" }
