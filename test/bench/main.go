// Command bench measures a real node: for 1 and 20 replicas, the time from
// `starling apply` to all replicas Running (median of 5 runs), and the
// agent's idle resident memory with no workload and with 20 replicas; then
// Service rules: lines, full sync and one-Service-changed sync for 100,
// 1,000 and 10,000 Services x 5 endpoints, in a namespace of its own.
// It runs one node in a network namespace (test/harness) with its own
// containerd, needs root, and prints a table. `make bench` runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

func manifest(name string, replicas int) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %s}
spec:
  replicas: %d
  selector: {matchLabels: {app: %s}}
  template:
    metadata: {labels: {app: %s}}
    spec:
      terminationGracePeriodSeconds: 2
      containers: [{name: echo, image: "starling.local/echo:v1", ports: [{containerPort: 8080}]}]
`, name, replicas, name, name)
}

func running(n *harness.Node, workload string) (int, int, error) {
	out, err := n.CLI("get", "replicas", "-o", "json")
	if err != nil {
		return 0, 0, err
	}
	var l struct {
		Items []struct{ Workload, Phase string }
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return 0, 0, err
	}
	run, total := 0, 0
	for _, r := range l.Items {
		if workload == "" || r.Workload == workload {
			total++
			if r.Phase == "Running" {
				run++
			}
		}
	}
	return run, total, nil
}

func waitFor(timeout time.Duration, f func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := f()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v (last error: %v)", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func main() {
	runs := flag.Int("runs", 5, "runs per replica count")
	child := flag.String("rules-child", "", "internal: measure Service rules inside this test network namespace")
	only := flag.String("only", "", "run one part: node or rules")
	flag.Parse()
	if *child != "" {
		if err := rulesChild(*child); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *only != "rules" {
		if err := run(*runs); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	if *only == "node" {
		return
	}
	if err := rulesBench(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(runs int) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("must run as root (network namespaces, containerd)")
	}
	ctx := context.Background()
	mod, err := harness.ModuleDir()
	if err != nil {
		return err
	}
	build, err := os.MkdirTemp("", "starling-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(build)
	binary, err := harness.BuildBinary(ctx, mod, build)
	if err != nil {
		return err
	}
	tar := filepath.Join(build, "echo.tar")
	if err := imagebuild.Echo(ctx, mod, "starling.local/echo:v1", "bench", tar); err != nil {
		return err
	}
	c, err := harness.NewNamed(filepath.Join(build, "cluster"), fmt.Sprintf("stbench%d-", os.Getpid()), binary, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	n, err := c.AddNode("bench1", 1)
	if err != nil {
		return err
	}
	if err := n.StartAgent(); err != nil {
		return err
	}
	if _, err := n.CLI("image", "import", tar); err != nil {
		return err
	}
	time.Sleep(3 * time.Second)
	idleEmpty := rssKiB(n.AgentPID())

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
			if _, err := n.CLI("delete", "deployment", name); err != nil {
				return err
			}
			if err := waitFor(2*time.Minute, func() (bool, error) {
				_, total, err := running(n, "")
				return total == 0, err
			}); err != nil {
				return fmt.Errorf("cleanup: %w", err)
			}
		}
		var parts []string
		for _, d := range ds {
			parts = append(parts, d.Round(time.Millisecond).String())
		}
		fmt.Printf("%-10d %-32s %s\n", size, median(ds).Round(time.Millisecond), strings.Join(parts, " "))
	}
	fmt.Printf("idle agent RSS, no workload: %.1f MiB\n", float64(idleEmpty)/1024)
	return nil
}
