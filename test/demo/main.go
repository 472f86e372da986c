// Command demo brings up Starling in network namespaces on this machine
// and runs the main scenario, printing every check it makes and a summary.
// It exits 0 only if every check passed. `make demo` runs it; `make
// demo-down` (demo --down) removes whatever a run left behind.
//
// It needs root, containerd, runc, iproute2, iptables and the CNI plugins
// (make deps installs them). It never touches the root network namespace.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

const prefix = "stdemo-"

type check struct {
	name   string
	detail string
	took   time.Duration
	err    error
}

type demo struct {
	checks []check
}

// step runs f, prints its outcome at once and records it.
func (d *demo) step(name string, f func() (string, error)) bool {
	start := time.Now()
	detail, err := f()
	c := check{name: name, detail: detail, took: time.Since(start), err: err}
	d.checks = append(d.checks, c)
	if err != nil {
		fmt.Printf("  FAIL %s (%s): %v\n", name, c.took.Round(time.Millisecond), err)
		return false
	}
	fmt.Printf("  ok   %s (%s)", name, c.took.Round(time.Millisecond))
	if detail != "" {
		fmt.Printf("\n         %s", strings.ReplaceAll(detail, "\n", "\n         "))
	}
	fmt.Println()
	return true
}

func (d *demo) summary() bool {
	fmt.Println("\n==== Summary ====")
	ok := true
	for _, c := range d.checks {
		mark := "PASS"
		if c.err != nil {
			mark, ok = "FAIL", false
		}
		fmt.Printf("%s  %-96s %8s\n", mark, c.name, c.took.Round(time.Millisecond))
	}
	pass := 0
	for _, c := range d.checks {
		if c.err == nil {
			pass++
		}
	}
	fmt.Printf("%d passed, %d failed\n", pass, len(d.checks)-pass)
	return ok
}

type replica struct {
	Name     string `json:"name"`
	Phase    string `json:"phase"`
	PodIP    string `json:"podIP"`
	Restarts int    `json:"restarts"`
	Workload string `json:"workload"`
}

func replicas(n *harness.Node) ([]replica, error) {
	out, err := n.CLI("get", "replicas", "-o", "json")
	if err != nil {
		return nil, err
	}
	var l struct{ Items []replica }
	return l.Items, json.Unmarshal([]byte(out), &l)
}

func poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func main() {
	dir := flag.String("dir", "/var/tmp/starling-demo", "where the demo keeps node data (removed at the end)")
	down := flag.Bool("down", false, "only remove what a previous run left behind")
	keep := flag.Bool("keep", false, "leave the node running with examples/hello.yaml applied (remove it with make demo-down)")
	binary := flag.String("binary", "", "starling binary to run (default: build one)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: must run as root (it creates network namespaces and runs containerd)")
		os.Exit(1)
	}
	if err := harness.Down(*dir, prefix); err != nil {
		fmt.Fprintln(os.Stderr, "demo: cleaning up a previous run:", err)
	}
	if *down {
		fmt.Println("demo: removed", *dir, "and namespaces", prefix+"*")
		return
	}
	os.Exit(run(*dir, *binary, *keep))
}

func run(dir, binary string, keep bool) int {
	ctx := context.Background()
	mod, err := harness.ModuleDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	build, err := os.MkdirTemp("", "starling-demo-build-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(build)

	d := &demo{}
	fmt.Println("==== Starling demo: one node, real containerd, in network namespaces ====")
	var echoTar string
	if !d.step("build starling and the echo image (static Go HTTP server, OCI tarball)", func() (string, error) {
		var err error
		if binary == "" {
			if binary, err = harness.BuildBinary(ctx, mod, build); err != nil {
				return "", err
			}
		} else if binary, err = filepath.Abs(binary); err != nil {
			return "", err
		}
		echoTar = filepath.Join(build, "echo-v1.tar")
		return "image starling.local/echo:v1", imagebuild.Echo(ctx, mod, "starling.local/echo:v1", "v1", echoTar)
	}) {
		d.summary()
		return 1
	}
	c, err := harness.NewNamed(dir, prefix, binary, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if !keep {
			c.Close()
		}
	}()
	var n *harness.Node
	if !d.step("node namespace with its own containerd, agent up", func() (string, error) {
		var err error
		if n, err = c.AddNode("node1", 1); err != nil {
			return "", err
		}
		n.PodSubnet = "" // the node claims a /24 of 10.22.0.0/16 by itself
		if err := n.StartAgent(); err != nil {
			return "", err
		}
		return fmt.Sprintf("netns %s, LAN address %s, claimed pod subnet %s\nAPI socket %s", n.NetNS, n.IP, n.PodSubnet, n.Socket), nil
	}) {
		return fail(d, c)
	}
	d.step("starling image import echo-v1.tar", func() (string, error) {
		out, err := n.CLI("image", "import", echoTar)
		return strings.TrimSpace(out), err
	})
	hello := filepath.Join(mod, "examples", "hello.yaml")
	var reps []replica
	d.step("starling apply -f examples/hello.yaml -> 3 replicas Running within 5s", func() (string, error) {
		if _, err := n.CLI("apply", "-f", hello); err != nil {
			return "", err
		}
		start := time.Now()
		err := poll(5*time.Second, func() error {
			var err error
			if reps, err = replicas(n); err != nil {
				return err
			}
			running := 0
			for _, r := range reps {
				if r.Phase == "Running" {
					running++
				}
			}
			if running != 3 {
				return fmt.Errorf("%d of 3 running", running)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
		out, _ := n.CLI("get", "replicas", "-o", "wide")
		return fmt.Sprintf("all Running %s after apply\n%s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(out)), nil
	})
	d.step("HTTP from the node namespace to each pod address gets the echo", func() (string, error) {
		_, subnet, _ := net.ParseCIDR(n.PodSubnet)
		var lines []string
		for _, r := range reps {
			if ip := net.ParseIP(r.PodIP); ip == nil || !subnet.Contains(ip) {
				return "", fmt.Errorf("%s: pod IP %q not in %s", r.Name, r.PodIP, n.PodSubnet)
			}
			var body string
			err := poll(3*time.Second, func() (err error) {
				body, err = harness.HTTPGet(n.NetNS, "http://"+r.PodIP+":8080/", time.Second)
				return err
			})
			if err != nil {
				return "", fmt.Errorf("%s: %w", r.Name, err)
			}
			if !strings.Contains(body, "hostname="+r.Name) {
				return "", fmt.Errorf("%s answered %q", r.Name, body)
			}
			lines = append(lines, fmt.Sprintf("%s -> %s", r.PodIP, strings.Join(strings.Fields(body), " ")))
		}
		return strings.Join(lines, "\n"), nil
	})
	d.step("kill -9 one container's process -> restarted on the next reconcile", func() (string, error) {
		if len(reps) == 0 {
			return "", fmt.Errorf("no replicas")
		}
		victim := reps[0]
		for _, pid := range n.TaskPIDs()["default_"+victim.Name] {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		start := time.Now()
		err := poll(15*time.Second, func() error {
			all, err := replicas(n)
			if err != nil {
				return err
			}
			for _, r := range all {
				if r.Name == victim.Name && r.Phase == "Running" && r.Restarts == 1 {
					return nil
				}
			}
			return fmt.Errorf("%s not back yet", victim.Name)
		})
		return fmt.Sprintf("%s Running again with restarts=1 after %s", victim.Name, time.Since(start).Round(time.Millisecond)), err
	})
	d.step("kill -9 the agent and restart it -> nothing duplicated or restarted", func() (string, error) {
		before := fmt.Sprint(n.TaskPIDs())
		n.KillAgent(syscall.SIGKILL)
		if err := n.RestartAgent(); err != nil {
			return "", err
		}
		time.Sleep(6 * time.Second) // more than one resync
		after := fmt.Sprint(n.TaskPIDs())
		if before != after {
			return "", fmt.Errorf("containers changed:\nbefore %s\nafter  %s", before, after)
		}
		all, err := replicas(n)
		if err != nil || len(all) != 3 {
			return "", fmt.Errorf("want 3 replicas, got %d (%v)", len(all), err)
		}
		return "same 3 container processes before and after (" + after + ")", nil
	})
	d.step("starling delete -f examples/hello.yaml -> no container, netns, veth or IPAM reservation left", func() (string, error) {
		if _, err := n.CLI("delete", "-f", hello); err != nil {
			return "", err
		}
		start := time.Now()
		err := poll(30*time.Second, func() error {
			if all, err := replicas(n); err != nil || len(all) != 0 {
				return fmt.Errorf("replicas left: %v %v", all, err)
			}
			if p := n.TaskPIDs(); len(p) != 0 {
				return fmt.Errorf("container processes left: %v", p)
			}
			if ents, _ := os.ReadDir(filepath.Join(n.DataDir, "netns")); len(ents) != 0 {
				return fmt.Errorf("%d pinned namespaces left", len(ents))
			}
			ents, _ := os.ReadDir(filepath.Join(n.DataDir, "ipam", "starling"))
			for _, e := range ents {
				if net.ParseIP(e.Name()) != nil {
					return fmt.Errorf("IPAM reservation %s left", e.Name())
				}
			}
			links, err := n.Exec(ctx, "ip", "-br", "link")
			if err != nil {
				return err
			}
			if strings.Contains(links, "veth") {
				return fmt.Errorf("veth left")
			}
			return nil
		})
		return fmt.Sprintf("clean after %s", time.Since(start).Round(time.Millisecond)), err
	})
	if !d.summary() {
		fmt.Println("\nagent log (last lines):\n" + n.Tail(30))
		return 1
	}
	if keep {
		if _, err := n.CLI("apply", "-f", hello); err != nil {
			fmt.Println("re-applying examples/hello.yaml:", err)
			return 1
		}
		fmt.Printf(`
The node is still running, with examples/hello.yaml applied again. Try:
  export STARLING_SERVER=%s
  %s get replicas -o wide
  %s describe deployment hello
  %s logs <replica name>
A pod from the node's network namespace:
  nsenter --net=/run/netns/%s wget -qO- http://<pod IP>:8080/
Remove everything with: make demo-down
`, n.Socket, binary, binary, binary, n.NetNS)
	}
	return 0
}

func fail(d *demo, c *harness.Cluster) int {
	d.summary()
	for _, n := range c.Nodes {
		fmt.Println(n.Diagnostics())
	}
	return 1
}
