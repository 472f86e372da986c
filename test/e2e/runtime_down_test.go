package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/test/harness"
)

// While a node's containerd is down, its replicas keep running and their
// readiness follows the probes: a replica whose probe fails leaves the
// Service rules of every node and shows not ready in get. Before, it
// stayed an endpoint everywhere and Running/ready in get for the whole
// outage (10 of 47 requests refused during a 27 s outage), and the agent
// logged an error every second. It warns once, and says when containerd
// is back.
func TestReadinessFollowsTheProbeWhileContainerdIsDown(t *testing.T) {
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	importEcho(t, n1)
	outage := harness.App{Name: "outage", Replicas: 2, Grace: harness.Seconds(1), Ports: harness.HTTPPort,
		Readiness: harness.HTTPProbe("/healthz", 1)}
	apply(t, n1, harness.Manifests(outage.Deployment(), outage.Service("outage", []corev1.ServicePort{harness.ServicePort(80, "http")})))
	var target replica // the replica on n1
	_, err := eventually(60*time.Second, func() error {
		byNode, err := readyOnePerNode(n2, "outage", 2)
		target = byNode[n1.Name]
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := target.PodIP + ":8080"
	inRules := func(want bool) error {
		for _, n := range []*harness.Node{n1, n2} {
			dest, err := n.ServiceDestinations(t.Context())
			if err != nil {
				return err
			}
			if dest[endpoint] != want {
				return fmt.Errorf("%s: endpoint %s in rules = %v, want %v", n.Name, endpoint, dest[endpoint], want)
			}
		}
		return nil
	}
	readyInGet := func(want bool) error {
		all, err := replicas(n2)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Name == target.Name {
				if r.Ready != want {
					return fmt.Errorf("get replicas: %s ready %v, want %v (%s %s)", r.Name, r.Ready, want, r.Phase, r.Reason)
				}
				return nil
			}
		}
		return fmt.Errorf("get replicas: %s not listed", target.Name)
	}

	logBefore, _ := os.ReadFile(n1.AgentLogPath())
	n1.StopContainerd()
	down := time.Now()
	if _, err := harness.HTTPGet(n1.NetNS, "http://"+endpoint+"/unready", time.Second); err != nil {
		t.Fatalf("the container stopped with containerd: %v", err)
	}
	took, err := eventually(15*time.Second, func() error {
		if err := inRules(false); err != nil {
			return err
		}
		return readyInGet(false)
	})
	if err != nil {
		t.Fatal("failing readiness with containerd down: ", err)
	}
	t.Logf("containerd down: the unready replica left both nodes' rules and get in %v", took.Round(time.Millisecond))
	if _, err := harness.HTTPGet(n1.NetNS, "http://"+endpoint+"/ready", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := eventually(15*time.Second, func() error {
		if err := inRules(true); err != nil {
			return err
		}
		return readyInGet(true)
	}); err != nil {
		t.Fatal("passing readiness with containerd down: ", err)
	}
	// At least 10 s into the outage: one warning, not one a second.
	time.Sleep(time.Until(down.Add(10 * time.Second)))
	logAll, _ := os.ReadFile(n1.AgentLogPath())
	during := string(logAll[len(logBefore):])
	var noisy []string
	for _, line := range strings.Split(during, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			noisy = append(noisy, line)
		}
	}
	if strings.Count(during, "container runtime unreachable") != 1 || len(noisy) > 3 {
		t.Fatalf("log over a 10 s outage: want one warning about the runtime, got %d warnings and errors:\n%s", len(noisy), strings.Join(noisy, "\n"))
	}

	if err := n1.StartContainerd(); err != nil {
		t.Fatal(err)
	}
	if _, err := eventually(15*time.Second, func() error {
		logAll, _ := os.ReadFile(n1.AgentLogPath())
		if !strings.Contains(string(logAll[len(logBefore):]), "container runtime reachable again") {
			return fmt.Errorf("the agent has not noticed containerd back")
		}
		if err := inRules(true); err != nil {
			return err
		}
		return readyInGet(true)
	}); err != nil {
		t.Fatal("containerd back: ", err)
	}
}
