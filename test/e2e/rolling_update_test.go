package e2e

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// rolling is a Deployment of the echo image with a 1 s readiness period
// and the given rolling-update budget; message changes the spec hash.
func rolling(name string, replicas int, maxUnavailable, maxSurge int, message string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %s}
spec:
  replicas: %d
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxUnavailable: %d, maxSurge: %d}
  selector: {matchLabels: {app: %s}}
  template:
    metadata: {labels: {app: %s}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: echo
        image: starling.local/echo:v1
        env: [{name: MESSAGE, value: %q}]
        ports: [{name: http, containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /healthz, port: http}
          periodSeconds: 1
`, name, replicas, maxUnavailable, maxSurge, name, name, message)
}

// census is one sample of a workload's copies, each node reporting only
// the containers it runs itself (its live observation, not gossip).
type census struct {
	available int // Running and ready copies
	existing  int // copies with a container (Terminating included)
	byHash    map[string]int
	ready     map[string]int // ready copies by hash
	names     map[string]bool
	complete  bool // every node answered
}

func takeCensus(nodes []*harness.Node, workload string) census {
	cs := census{byHash: map[string]int{}, ready: map[string]int{}, names: map[string]bool{}, complete: true}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func(n *harness.Node) {
			defer wg.Done()
			var l struct{ Items []replica }
			err := n.APIGet("/v1/replicas", &l)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				cs.complete = false
				return
			}
			for _, r := range l.Items {
				if r.Node != n.Name || r.Workload != workload || r.Phase == "Pending" || r.Phase == "CreateBackOff" {
					continue
				}
				cs.existing++
				cs.byHash[r.SpecHash]++
				cs.names[r.Name] = true
				if r.Phase == "Running" && r.Ready {
					cs.available++
					cs.ready[r.SpecHash]++
				}
			}
		}(n)
	}
	wg.Wait()
	return cs
}

// sampler takes a census every 100 ms until stopped and keeps the
// extremes.
type sampler struct {
	stop                   chan struct{}
	done                   chan struct{}
	minAvailable, maxExist int
	samples                int
}

func sample(nodes []*harness.Node, workload string) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{}), minAvailable: 1 << 30}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			cs := takeCensus(nodes, workload)
			if !cs.complete {
				continue // a node restarting: its containers are not observed
			}
			s.samples++
			s.minAvailable = min(s.minAvailable, cs.available)
			s.maxExist = max(s.maxExist, cs.existing)
		}
	}()
	return s
}

func (s *sampler) finish() { close(s.stop); <-s.done }

// rolledOutTo waits until the workload has exactly replicas copies, all of
// one hash other than old, all ready, and returns that hash.
func rolledOutTo(t *testing.T, nodes []*harness.Node, workload string, replicas int, old string, timeout time.Duration) (string, time.Duration) {
	t.Helper()
	var hash string
	took, err := eventually(timeout, func() error {
		cs := takeCensus(nodes, workload)
		if !cs.complete {
			return fmt.Errorf("a node did not answer")
		}
		if len(cs.byHash) != 1 || cs.existing != replicas {
			return fmt.Errorf("copies by hash %v, want %d of one new hash", cs.byHash, replicas)
		}
		for h := range cs.byHash {
			hash = h
		}
		if hash == old || cs.ready[hash] != replicas {
			return fmt.Errorf("hash %s (old %s): %d of %d ready", hash, old, cs.ready[hash], replicas)
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
	if _, err := n1.CLI("image", "import", echoV1Tar); err != nil {
		t.Fatal(err)
	}
	apply(t, n1, rolling("roll", 6, 1, 0, "v1"))
	h1, took := rolledOutTo(t, nodes, "roll", 6, "", 90*time.Second)
	t.Logf("v1: 6 replicas ready in %v", took.Round(time.Millisecond))

	// maxUnavailable=1, maxSurge=0.
	s := sample(nodes, "roll")
	apply(t, n1, rolling("roll", 6, 1, 0, "v2"))
	h2, took := rolledOutTo(t, nodes, "roll", 6, h1, 120*time.Second)
	s.finish()
	t.Logf("maxUnavailable=1 maxSurge=0: rolled out in %v; %d samples, min available %d, max copies %d",
		took.Round(time.Millisecond), s.samples, s.minAvailable, s.maxExist)
	if s.minAvailable < 5 || s.maxExist > 6 {
		t.Fatalf("budget broken: min available %d (want >= 5), max copies %d (want <= 6)", s.minAvailable, s.maxExist)
	}

	// maxUnavailable=0, maxSurge=1.
	s = sample(nodes, "roll")
	apply(t, n1, rolling("roll", 6, 0, 1, "v3"))
	h3, took := rolledOutTo(t, nodes, "roll", 6, h2, 120*time.Second)
	s.finish()
	t.Logf("maxUnavailable=0 maxSurge=1: rolled out in %v; %d samples, min available %d, max copies %d",
		took.Round(time.Millisecond), s.samples, s.minAvailable, s.maxExist)
	if s.minAvailable < 6 || s.maxExist > 7 {
		t.Fatalf("budget broken: min available %d (want >= 6), max copies %d (want <= 7)", s.minAvailable, s.maxExist)
	}

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
		if cs.ready[h3] != 8 || cs.existing != 8 {
			return fmt.Errorf("after scale to 8: %d ready of hash %s, %d copies", cs.ready[h3], h3, cs.existing)
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
		if cs.byHash[h3] == 8 || cs.byHash[h3] == 0 {
			return fmt.Errorf("not mid-rollout: %v", cs.byHash)
		}
		// A node that still has old copies to replace.
		var l struct{ Items []replica }
		for _, n := range nodes {
			if err := n.APIGet("/v1/replicas", &l); err != nil {
				return err
			}
			for _, r := range l.Items {
				if r.Node == n.Name && r.Workload == "roll" && r.SpecHash == h3 && r.Phase == "Running" {
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
	for name := range takeCensus(nodes, "roll").names {
		names = append(names, name)
	}
	sort.Strings(names)
	if len(names) != 8 || strings.Contains(strings.Join(names, " "), h3) {
		t.Fatalf("after the rollout: %v", names)
	}
}
