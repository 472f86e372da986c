// Command bench measures a real node: for 1 and 20 replicas, the time from
// `starling apply` to all replicas Running (median of 5 runs), and the
// agent's idle resident memory with no workload and with 20 replicas; then
// a pod of one container against one of 3 containers, 2 init containers,
// a ConfigMap volume and a claim (pod.go); then Service rules: lines, full sync and one-Service-changed sync for 100,
// 1,000 and 10,000 Services x 5 endpoints, in a namespace of its own; then,
// on 3 nodes, failover (a cut-off node's endpoints gone from the others'
// rules, its replicas ready elsewhere) and rolling-update durations (see
// cluster.go); then the time a new node takes to join, with a join token
// and with --insecure (join.go); then an image's trip from the node that
// imported it to one that needs it, against a plain copy (images.go).
// Nodes run in network namespaces
// (test/harness), each with its own containerd; it needs root and prints
// a table per group (-only node|pod|ingress|rules|cluster|join|image runs one). `make
// bench` runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

func manifest(name string, replicas int) string {
	return harness.App{Name: name, Replicas: int32(replicas), Grace: harness.Seconds(2), Ports: harness.Port8080}.Deployment()
}

func running(n *harness.Node, workload string) (int, int, error) {
	out, err := n.CLI("get", "replicas", "-o", "json")
	if err != nil {
		return 0, 0, err
	}
	var l struct {
		Items []struct {
			Workload string
			Phase    api.Phase
		}
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return 0, 0, err
	}
	run, total := 0, 0
	for _, r := range l.Items {
		if workload == "" || r.Workload == workload {
			total++
			if r.Phase == api.PhaseRunning {
				run++
			}
		}
	}
	return run, total, nil
}

func waitFor(timeout time.Duration, f func() (bool, error)) error {
	_, err := harness.Poll(context.Background(), 20*time.Millisecond, timeout, func() error {
		ok, err := f()
		if !ok {
			return fmt.Errorf("not yet (last error: %v)", err)
		}
		return nil
	})
	return err
}

// rssParts is the anonymous and the file-backed part of a process's
// resident set, in KiB (/proc/PID/smaps_rollup).
func rssParts(pid int) (anon, file int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "Anonymous:":
			anon = v
		case "Rss:":
			file = v
		}
	}
	return anon, file - anon
}

func rssKiB(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			var kb int
			fmt.Sscan(strings.TrimSpace(strings.TrimPrefix(line, "VmRSS:")), &kb)
			return kb
		}
	}
	return 0
}

// deleteAndWait deletes Deployment name and waits until node n runs no
// replica at all.
func deleteAndWait(n *harness.Node, name string) error {
	if _, err := n.CLI("delete", "deployment", name); err != nil {
		return err
	}
	if err := waitFor(2*time.Minute, func() (bool, error) {
		_, total, err := running(n, "")
		return total == 0, err
	}); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	return nil
}

// durations are ds, rounded to the millisecond, in a line.
func durations(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, d.Round(time.Millisecond).String())
	}
	return strings.Join(parts, " ")
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// groups are the figure groups, in the order a run without -only runs them.
var groups = []string{"node", "pod", "ingress", "rules", "cluster", "join", "image"}

func main() {
	runs := flag.Int("runs", 5, "node group: runs per replica count")
	failoverRuns := flag.Int("failover-runs", 5, "cluster group: failover runs")
	rolloutRuns := flag.Int("rollout-runs", 3, "cluster group: rolling updates per strategy")
	child := flag.String("rules-child", "", "internal: measure Service rules inside this test network namespace")
	flag.StringVar(&rulesBackends, "rules-backends", "iptables,nftables", "rules group: the Service rule backends to measure")
	only := flag.String("only", "", "run one group: "+strings.Join(groups, ", "))
	copyRecvAddr := flag.String("copy-recv", "", "internal (image group): receive one TCP copy on this address")
	copyOut := flag.String("copy-out", "/dev/null", "internal (image group): where -copy-recv writes")
	copySendAddr := flag.String("copy-send", "", "internal (image group): send -copy-in to this address")
	copyIn := flag.String("copy-in", "", "internal (image group): the file -copy-send sends")
	flag.Parse()
	if *copyRecvAddr != "" || *copySendAddr != "" {
		var err error
		if *copyRecvAddr != "" {
			err = copyRecv(*copyRecvAddr, *copyOut)
		} else {
			err = copySend(*copySendAddr, *copyIn)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *child != "" {
		if err := rulesChild(*child); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *only != "" && !slices.Contains(groups, *only) {
		fmt.Fprintf(os.Stderr, "bench: -only %q: want one of %s\n", *only, strings.Join(groups, ", "))
		os.Exit(2)
	}
	if *failoverRuns < 1 || *rolloutRuns < 1 || *runs < 1 {
		fmt.Fprintln(os.Stderr, "bench: -runs, -failover-runs and -rollout-runs must be at least 1")
		os.Exit(2)
	}
	for _, g := range groups {
		if *only != "" && *only != g {
			continue
		}
		var err error
		switch g {
		case "node":
			err = withArtifacts(func(a artifacts) error { return run(a, *runs) })
		case "pod":
			err = withArtifacts(func(a artifacts) error { return podBench(a, *runs) })
		case "ingress":
			err = withArtifacts(func(a artifacts) error { return ingressBench(a, 5*time.Second) })
		case "rules":
			err = rulesBench()
		case "cluster":
			err = withArtifacts(func(a artifacts) error { return clusterBench(a, *failoverRuns, *rolloutRuns) })
		case "join":
			err = withArtifacts(func(a artifacts) error { return joinBench(a, *runs) })
		case "image":
			err = withArtifacts(func(a artifacts) error { return imageBench(a, 3) })
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s group: %v\n", g, err)
			os.Exit(1)
		}
	}
}

// artifacts are what a group with real nodes needs: a scratch directory,
// the starling binary and the echo image tarball.
type artifacts struct {
	dir, binary, echoTar string
}

// withArtifacts builds the artifacts in a fresh directory, runs f, and
// removes the directory.
func withArtifacts(f func(artifacts) error) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("must run as root (network namespaces, containerd)")
	}
	ctx := context.Background()
	mod, err := harness.ModuleDir()
	if err != nil {
		return err
	}
	// A short directory: containerd's unix socket paths must fit 108 bytes.
	dir, err := os.MkdirTemp("", "starling-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	a := artifacts{dir: dir, echoTar: filepath.Join(dir, "echo.tar")}
	if a.binary, err = harness.BuildBinary(ctx, mod, dir); err != nil {
		return err
	}
	if err := imagebuild.Echo(ctx, mod, "starling.local/echo:v1", "bench", a.echoTar); err != nil {
		return fmt.Errorf("build echo image: %w", err)
	}
	return f(a)
}

// firstNode creates a cluster in a.dir/sub whose namespaces are named
// prefix<pid>-, with one node, name, whose agent it starts; on an error
// it closes the cluster.
func firstNode(a artifacts, sub, prefix, name string) (*harness.Cluster, *harness.Node, error) {
	c, err := harness.NewNamed(filepath.Join(a.dir, sub), fmt.Sprintf("%s%d-", prefix, os.Getpid()), a.binary, nil)
	if err != nil {
		return nil, nil, err
	}
	n, err := c.AddNode(name, 1)
	if err == nil {
		err = n.StartAgent()
	}
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, n, nil
}

func run(a artifacts, runs int) error {
	c, n, err := firstNode(a, "cluster", "stbench", "bench1")
	if err != nil {
		return err
	}
	defer c.Close()
	// Idle with no workload: settled, nothing imported yet.
	time.Sleep(30 * time.Second)
	idleEmpty := rssKiB(n.AgentPID())
	idleAnon, idleFile := rssParts(n.AgentPID())
	if _, err := n.CLI("image", "import", a.echoTar); err != nil {
		return err
	}

	fmt.Println("Starling node benchmark (1 node, real containerd, echo image)")
	fmt.Printf("%-10s %-32s %s\n", "replicas", "apply -> all Running (median)", "runs")
	for _, size := range []int{1, 20} {
		var ds []time.Duration
		for i := 0; i < runs; i++ {
			name := fmt.Sprintf("bench-%d-%d", size, i)
			start := time.Now()
			if _, err := n.CLIInput(strings.NewReader(manifest(name, size)), "apply", "-f", "-"); err != nil {
				return err
			}
			if err := waitFor(2*time.Minute, func() (bool, error) {
				r, _, err := running(n, name)
				return r == size, err
			}); err != nil {
				return fmt.Errorf("%d replicas: %w", size, err)
			}
			ds = append(ds, time.Since(start))
			if size == 20 && i == runs-1 {
				time.Sleep(10 * time.Second)
				fmt.Printf("%-10s idle agent RSS with 20 replicas: %.1f MiB\n", "", float64(rssKiB(n.AgentPID()))/1024)
			}
			if err := deleteAndWait(n, name); err != nil {
				return err
			}
		}
		fmt.Printf("%-10d %-32s %s\n", size, median(ds).Round(time.Millisecond), durations(ds))
	}
	fmt.Printf("idle agent RSS, no workload: %.1f MiB (anonymous %.1f MiB, file-backed %.1f MiB)\n",
		float64(idleEmpty)/1024, float64(idleAnon)/1024, float64(idleFile)/1024)
	return nil
}
