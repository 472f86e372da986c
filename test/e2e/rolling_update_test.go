package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// rolling is a Deployment of the echo image with a 1 s readiness period
// and the given rolling-update budget; message changes the spec hash.
func rolling(name string, replicas int, maxUnavailable, maxSurge int, message string) string {
	unavailable, surge := intstr.FromInt32(int32(maxUnavailable)), intstr.FromInt32(int32(maxSurge))
	return harness.App{Name: name, Replicas: int32(replicas), Grace: harness.Seconds(2), Env: harness.Env("MESSAGE", message),
		Ports: harness.HTTPPort, Readiness: harness.HTTPProbe("/healthz", 0)}.Deployment(func(d *appsv1.Deployment) {
		d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &unavailable, MaxSurge: &surge}}
	})
}

// takeCensus counts the copies of workload (namespace default), each node
// reporting only the containers it runs itself.
func takeCensus(nodes []*harness.Node, workload string) harness.Census {
	return harness.TakeCensus(nodes, "default", workload)
}

// rolledOutTo waits until the workload has exactly replicas copies, all of
// one hash other than old, all ready, and returns that hash.
func rolledOutTo(t *testing.T, nodes []*harness.Node, workload string, replicas int, old string, timeout time.Duration) (string, time.Duration) {
	t.Helper()
	var hash string
	took, err := eventually(timeout, func() error {
		cs := takeCensus(nodes, workload)
		if !cs.Complete {
			return fmt.Errorf("a node did not answer")
		}
		if len(cs.ByHash) != 1 || cs.Existing != replicas {
			return fmt.Errorf("copies by hash %v, want %d of one new hash", cs.ByHash, replicas)
		}
		for h := range cs.ByHash {
			hash = h
		}
		if hash == old || cs.ReadyByHash[hash] != replicas {
			return fmt.Errorf("hash %s (old %s): %d of %d ready", hash, old, cs.ReadyByHash[hash], replicas)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hash, took
}

// TestRollingUpdateKeepsBudgetAcrossNodes rolls a 6-replica Deployment
// over 3 nodes while sampling every node every 100 ms: with
// maxUnavailable=1, maxSurge=0 never fewer than 5 available; with
// maxUnavailable=0, maxSurge=1 never fewer than 6 available nor more than
// 7 copies; an agent killed mid-rollout lets the rollout finish after it
// restarts; a change of replicas alone restarts nothing.
func TestRollingUpdateKeepsBudgetAcrossNodes(t *testing.T) {
	c := newCluster(t, 3)
	nodes := c.Nodes
	n1 := nodes[0]
	importEcho(t, n1)
	apply(t, n1, rolling("roll", 6, 1, 0, "v1"))
	h1, took := rolledOutTo(t, nodes, "roll", 6, "", 90*time.Second)
	t.Logf("v1: 6 replicas ready in %v", took.Round(time.Millisecond))

	// roll rolls out message with a budget, sampling every node every
	// 100 ms: never fewer than minAvailable available nor more than
	// maxExisting copies.
	roll := func(maxUnavailable, maxSurge int, message, old string, minAvailable, maxExisting int) string {
		t.Helper()
		s := harness.Sample(nodes, "default", "roll", 100*time.Millisecond)
		apply(t, n1, rolling("roll", 6, maxUnavailable, maxSurge, message))
		h, took := rolledOutTo(t, nodes, "roll", 6, old, 120*time.Second)
		s.Stop()
		t.Logf("maxUnavailable=%d maxSurge=%d: rolled out in %v; %d samples, min available %d, max copies %d",
			maxUnavailable, maxSurge, took.Round(time.Millisecond), s.Samples, s.MinAvailable, s.MaxExisting)
		if s.MinAvailable < minAvailable || s.MaxExisting > maxExisting {
			t.Fatalf("budget broken: min available %d (want >= %d), max copies %d (want <= %d)", s.MinAvailable, minAvailable, s.MaxExisting, maxExisting)
		}
		return h
	}
	h2 := roll(1, 0, "v2", h1, 5, 6)
	h3 := roll(0, 1, "v3", h2, 6, 7)

	// Replicas alone: the 6 keep their containers and processes.
	before := map[string][]int{}
	for _, n := range nodes {
		for id, pids := range n.TaskPIDs() {
			before[id] = pids
		}
	}
	apply(t, n1, rolling("roll", 8, 0, 1, "v3"))
	_, err := eventually(60*time.Second, func() error {
		cs := takeCensus(nodes, "roll")
		if cs.ReadyByHash[h3] != 8 || cs.Existing != 8 {
			return fmt.Errorf("after scale to 8: %d ready of hash %s, %d copies", cs.ReadyByHash[h3], h3, cs.Existing)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		after := n.TaskPIDs()
		for id, pids := range before {
			if got, ok := after[id]; ok && fmt.Sprint(got) != fmt.Sprint(pids) {
				t.Fatalf("scale restarted %s: pids %v -> %v", id, pids, got)
			}
		}
	}
	kept := 0
	for _, n := range nodes {
		after := n.TaskPIDs()
		for id := range before {
			if _, ok := after[id]; ok {
				kept++
			}
		}
	}
	if kept != 6 {
		t.Fatalf("scale to 8: %d of the 6 containers kept, want 6", kept)
	}

	// kill -9 an agent mid-rollout; it restarts and the rollout finishes.
	apply(t, n1, rolling("roll", 8, 1, 0, "v4"))
	var victim *harness.Node
	_, err = eventually(60*time.Second, func() error {
		cs := takeCensus(nodes, "roll")
		if cs.ByHash[h3] == 8 || cs.ByHash[h3] == 0 {
			return fmt.Errorf("not mid-rollout: %v", cs.ByHash)
		}
		// A node that still has old copies to replace.
		for _, n := range nodes {
			items, err := apiReplicas(n)
			if err != nil {
				return err
			}
			for _, r := range items {
				if r.Node == n.Name && r.Workload == "roll" && r.SpecHash == h3 && r.Phase == api.PhaseRunning {
					victim = n
					return nil
				}
			}
		}
		return fmt.Errorf("no node with old copies left")
	})
	if err != nil {
		t.Fatal(err)
	}
	victim.KillAgent(9)
	if err := victim.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	_, took = rolledOutTo(t, nodes, "roll", 8, h3, 180*time.Second)
	t.Logf("agent on %s killed -9 mid-rollout and restarted: rollout finished %v later", victim.Name, took.Round(time.Millisecond))
	names := []string{}
	for name := range takeCensus(nodes, "roll").Names {
		names = append(names, name)
	}
	sort.Strings(names)
	if len(names) != 8 || strings.Contains(strings.Join(names, " "), h3) {
		t.Fatalf("after the rollout: %v", names)
	}
}
