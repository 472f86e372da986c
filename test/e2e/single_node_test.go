package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

type replica struct {
	Name      string    `json:"name"`
	Namespace string    `json:"namespace"`
	Workload  string    `json:"workload"`
	Ordinal   int       `json:"ordinal"`
	Node      string    `json:"node"`
	Phase     api.Phase `json:"phase"`
	Ready     bool      `json:"ready"`
	PodIP     string    `json:"podIP"`
	SpecHash  string    `json:"specHash"`
	Restarts  int       `json:"restarts"`
	Reason    string    `json:"reason"`
}

// apiReplicas is replicas through the API, without the CLI.
func apiReplicas(n *harness.Node) ([]replica, error) {
	items, err := n.API().Replicas(context.Background())
	out := make([]replica, 0, len(items))
	for _, r := range items {
		out = append(out, replica{Name: r.Name, Namespace: r.Namespace, Workload: r.Workload, Ordinal: r.Ordinal, Node: r.Node,
			Phase: r.Phase, Ready: r.Ready, PodIP: r.PodIP, SpecHash: r.SpecHash, Restarts: r.Restarts, Reason: r.Reason})
	}
	return out, err
}

func replicas(n *harness.Node) ([]replica, error) {
	out, err := n.CLI("get", "replicas", "-A", "-o", "json")
	if err != nil {
		return nil, err
	}
	var l struct{ Items []replica }
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return nil, fmt.Errorf("decode get replicas: %w: %s", err, out)
	}
	return l.Items, nil
}

// waitRunning waits until exactly want replicas of workload run.
func waitRunning(t *testing.T, n *harness.Node, workload string, want int, timeout time.Duration) ([]replica, time.Duration) {
	t.Helper()
	var got []replica
	took, err := eventually(timeout, func() error {
		all, err := replicas(n)
		if err != nil {
			return err
		}
		got = nil
		running := 0
		for _, r := range all {
			if r.Workload == workload {
				got = append(got, r)
				if r.Phase == api.PhaseRunning {
					running++
				}
			}
		}
		if running != want || len(got) != want {
			return fmt.Errorf("%d of %d replicas running (%d listed): %+v", running, want, len(got), got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got, took
}

// taskPIDs renders each container's PIDs as "pid,pid", keyed by ID.
func taskPIDs(t *testing.T, n *harness.Node) map[string]string {
	t.Helper()
	out := map[string]string{}
	for id, pids := range n.TaskPIDs() {
		out[id] = strings.Trim(strings.Join(strings.Fields(fmt.Sprint(pids)), ","), "[]")
	}
	return out
}

// TestSingleNodeLifecycle is the one-node scenario of `make demo`: apply,
// serve, self-heal after a container kill, adopt after an agent kill, and
// clean deletion.
func TestSingleNodeLifecycle(t *testing.T) {
	c := newCluster(t, 1)
	n := c.Nodes[0]
	if out, err := n.CLI("image", "import", echoV1Tar); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(out, "starling.local/echo:v1") {
		t.Fatalf("image import output: %q", out)
	}
	mod, _ := harness.ModuleDir()
	if out, err := n.CLI("apply", "-f", filepath.Join(mod, "examples", "hello.yaml")); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(out, "deployment.apps/hello created") {
		t.Fatalf("apply output: %q", out)
	}
	reps, took := waitRunning(t, n, "hello", 3, 5*time.Second)
	t.Logf("3 replicas running %v after apply", took.Round(time.Millisecond))
	_, subnet, _ := net.ParseCIDR(n.PodSubnet)
	for _, r := range reps {
		if ip := net.ParseIP(r.PodIP); ip == nil || !subnet.Contains(ip) {
			t.Fatalf("replica %s has pod IP %q outside %s", r.Name, r.PodIP, n.PodSubnet)
		}
		var body string
		_, err := eventually(3*time.Second, func() (err error) {
			body, err = harness.HTTPGet(n.NetNS, "http://"+r.PodIP+":8080/", time.Second)
			return err
		})
		if err != nil {
			t.Fatalf("HTTP to %s (%s): %v", r.Name, r.PodIP, err)
		}
		if !strings.Contains(body, "hostname="+r.Name) || !strings.Contains(body, "podIP="+r.PodIP) {
			t.Fatalf("replica %s answered %q", r.Name, body)
		}
	}

	// kill -9 of one container's process: restarted on the next reconcile.
	var before map[string]string
	if _, err := eventually(5*time.Second, func() error {
		if before = taskPIDs(t, n); len(before) != 3 {
			return fmt.Errorf("want 3 container cgroups with processes, got %v", before)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	victim := "default_" + reps[0].Name
	for _, p := range strings.Split(before[victim], ",") {
		var pid int
		fmt.Sscan(p, &pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	took, err := eventually(10*time.Second, func() error {
		all, err := replicas(n)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Name == reps[0].Name && (r.Phase != api.PhaseRunning || r.Restarts != 1) {
				return fmt.Errorf("%s: phase %s restarts %d", r.Name, r.Phase, r.Restarts)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal("killed container not restarted: ", err)
	}
	t.Logf("killed container back after %v", took.Round(time.Millisecond))

	// kill -9 of the agent and restart: nothing duplicated or restarted.
	before = taskPIDs(t, n)
	n.KillAgent(syscall.SIGKILL)
	if err := n.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second) // more than one resync interval
	after := taskPIDs(t, n)
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("agent restart changed containers:\nbefore %v\nafter  %v", before, after)
	}
	waitRunning(t, n, "hello", 3, time.Second)

	// delete: no container, namespace, veth or IPAM reservation left.
	if out, err := n.CLI("delete", "-f", filepath.Join(mod, "examples", "hello.yaml")); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(out, "deployment.apps/hello deleted") {
		t.Fatalf("delete output: %q", out)
	}
	_, err = eventually(20*time.Second, func() error {
		if all, err := replicas(n); err != nil || len(all) != 0 {
			return fmt.Errorf("replicas left: %v %v", all, err)
		}
		if pids := taskPIDs(t, n); len(pids) != 0 {
			return fmt.Errorf("container processes left: %v", pids)
		}
		if ents, _ := os.ReadDir(filepath.Join(n.DataDir, "netns")); len(ents) != 0 {
			return fmt.Errorf("%d pinned namespaces left", len(ents))
		}
		ents, _ := os.ReadDir(filepath.Join(n.DataDir, "ipam", "starling"))
		for _, e := range ents {
			if net.ParseIP(e.Name()) != nil {
				return fmt.Errorf("IPAM reservation left: %s", e.Name())
			}
		}
		links, err := n.Exec(t.Context(), "ip", "-br", "link")
		if err != nil {
			return err
		}
		if strings.Contains(links, "veth") {
			return fmt.Errorf("veth left:\n%s", links)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
