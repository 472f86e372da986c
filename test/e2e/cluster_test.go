package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// perNode counts Running replicas of workload by node, as n reports them.
func perNode(n *harness.Node, workload string) (map[string]int, int, error) {
	all, err := replicas(n)
	if err != nil {
		return nil, 0, err
	}
	out := map[string]int{}
	total := 0
	for _, r := range all {
		if r.Workload != workload {
			continue
		}
		total++
		if r.Phase == api.PhaseRunning {
			out[r.Node]++
		}
	}
	return out, total, nil
}

func fmtCounts(m map[string]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// TestThreeNodeClusterPlacementFailoverAndRejoin is the masterless
// cluster scenario: a write on one node runs everywhere, any node answers
// for the whole cluster, a lost node's replicas move to the others, and a
// returning node takes its share back make-before-break (the other two,
// at 3 replicas each, are over their load bound of 2).
func TestThreeNodeClusterPlacementFailoverAndRejoin(t *testing.T) {
	t.Parallel() // long and mostly waiting: runs beside another such test
	c := newCluster(t, 3)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	// The image is imported on n1 only: the others fetch it from a peer.
	if _, err := n1.CLI("image", "import", echoV1Tar); err != nil {
		t.Fatal(err)
	}
	_, err := eventually(30*time.Second, func() error {
		out, err := n3.CLI("get", "nodes")
		if err != nil {
			return err
		}
		if strings.Count(out, " alive ") != 3 {
			return fmt.Errorf("want 3 alive nodes:\n%s", out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	apply(t, n1, deployment("spread", 6, "x"))
	took, err := eventually(30*time.Second, func() error {
		counts, total, err := perNode(n3, "spread")
		if err != nil {
			return err
		}
		if total != 6 || counts["n1"] != 2 || counts["n2"] != 2 || counts["n3"] != 2 {
			return fmt.Errorf("want 2 Running on each node, 6 listed; got %s (%d listed)", fmtCounts(counts), total)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("6 replicas Running, 2 per node, seen through n3, %v after apply on n1", took.Round(time.Millisecond))
	for _, n := range c.Nodes {
		if got := n.RunningContainers(); got != 2 {
			t.Fatalf("%s runs %d containers, want 2", n.Name, got)
		}
		if out, err := n.CLI("image", "ls"); err != nil || !strings.Contains(out, "starling.local/echo:v1") {
			t.Fatalf("%s image ls: %q %v", n.Name, out, err)
		}
	}

	// Pod to pod across nodes, by pod IP: routed, and not masqueraded.
	var onN1, onN2 replica
	all0, err := replicas(n1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all0 {
		switch r.Node {
		case "n1":
			onN1 = r
		case "n2":
			onN2 = r
		}
	}
	var body string
	_, err = eventually(5*time.Second, func() (err error) {
		body, err = n1.PodHTTPGet("default", onN1.Name, "http://"+onN2.PodIP+":8080/", time.Second)
		return err
	})
	if err != nil || !strings.Contains(body, "hostname="+onN2.Name) || !strings.Contains(body, "remote="+onN1.PodIP+":") {
		t.Fatalf("pod %s (%s) on n1 -> pod %s (%s) on n2: %q %v", onN1.Name, onN1.PodIP, onN2.Name, onN2.PodIP, body, err)
	}
	// A route deleted by hand is back within 2 s.
	if _, err := n1.Exec(t.Context(), "ip", "route", "del", n2.PodSubnet); err != nil {
		t.Fatal(err)
	}
	took, err = eventually(2*time.Second, func() error {
		out, err := n1.Exec(t.Context(), "ip", "route", "show", n2.PodSubnet)
		if err != nil || !strings.Contains(out, "via "+n2.IP) || !strings.Contains(out, "proto 87") {
			return fmt.Errorf("route to %s: %q %v", n2.PodSubnet, out, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod-to-pod across nodes keeps the client's address; deleted route back in %v", took.Round(time.Millisecond))

	// logs of a replica on n3, asked through n1, are proxied to n3.
	all, err := replicas(n1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.Node == "n3" {
			out, err := n1.CLI("logs", r.Name)
			if err != nil || !strings.Contains(out, "echo listening on :8080 as "+r.Name) {
				t.Fatalf("logs of %s on n3 through n1: %q %v", r.Name, out, err)
			}
			break
		}
	}

	// Cut n3 off: its replicas move to n1 and n2.
	cut := time.Now()
	if err := n3.CutOff(); err != nil {
		t.Fatal(err)
	}
	took, err = eventually(90*time.Second, func() error {
		counts, _, err := perNode(n1, "spread")
		if err != nil {
			return err
		}
		if counts["n1"]+counts["n2"] != 6 || counts["n3"] != 0 {
			return fmt.Errorf("want 6 Running on n1+n2; got %s", fmtCounts(counts))
		}
		if n1.RunningContainers()+n2.RunningContainers() != 6 {
			return fmt.Errorf("containers: n1 %d n2 %d", n1.RunningContainers(), n2.RunningContainers())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("n3 cut off: its replicas Running on n1 and n2 %v later", took.Round(time.Millisecond))
	// Its route is withdrawn on the peers.
	took, err = eventually(10*time.Second, func() error {
		out, err := n1.Exec(t.Context(), "ip", "route", "show", n3.PodSubnet)
		if err != nil || strings.TrimSpace(out) != "" {
			return fmt.Errorf("route to n3's subnet still there: %q %v", out, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("route to n3 withdrawn on n1 %v after the cut", time.Since(cut).Round(time.Millisecond))

	// Bring n3 back: it takes its share again, make-before-break, and once
	// settled exactly 6 containers run.
	if err := n3.Reconnect(); err != nil {
		t.Fatal(err)
	}
	// Like a host whose link came back, n3 has its default route again
	// (the demo left node3 without one: node -> ClusterIP failed there
	// with "Network is unreachable").
	if out, err := n3.Exec(t.Context(), "ip", "route", "show", "default"); err != nil || !strings.Contains(out, "via "+harness.LANPrefix+".254") {
		t.Fatalf("n3 after reconnecting: default route %q %v", out, err)
	}
	took, err = eventually(120*time.Second, func() error {
		counts, _, err := perNode(n2, "spread")
		if err != nil {
			return err
		}
		if counts["n1"] != 2 || counts["n2"] != 2 || counts["n3"] != 2 {
			return fmt.Errorf("want 2 per node; got %s", fmtCounts(counts))
		}
		total := 0
		for _, n := range c.Nodes {
			total += n.RunningContainers()
		}
		if total != 6 {
			return fmt.Errorf("%d containers running across nodes, want 6", total)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("n3 back: rebalanced to 2 per node, 6 containers in all, %v after reconnect", took.Round(time.Millisecond))

	// Delete through n2: gone everywhere.
	if _, err := n2.CLI("delete", "deployment", "spread"); err != nil {
		t.Fatal(err)
	}
	_, err = eventually(30*time.Second, func() error {
		for _, n := range c.Nodes {
			if got := n.RunningContainers(); got != 0 {
				return fmt.Errorf("%s still runs %d containers", n.Name, got)
			}
			if _, total, err := perNode(n, "spread"); err != nil || total != 0 {
				return fmt.Errorf("%s lists %d replicas (%v)", n.Name, total, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
