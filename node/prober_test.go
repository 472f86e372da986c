package node

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/test/harness"
)

// execScript answers the fake runtime's exec probes: argv[1] names a
// check, which passes unless failing says otherwise; calls are counted.
type execScript struct {
	mu      sync.Mutex
	failing map[string]bool
	calls   map[string]int
}

func newExecScript(failing ...string) *execScript {
	s := &execScript{failing: map[string]bool{}, calls: map[string]int{}}
	for _, f := range failing {
		s.failing[f] = true
	}
	return s
}

func (s *execScript) exec(_ string, argv []string) (int, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[argv[1]]++
	if s.failing[argv[1]] {
		return 1, argv[1] + " is failing\n", nil
	}
	return 0, "", nil
}

func (s *execScript) set(check string, failing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing[check] = failing
}

func (s *execScript) count(check string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[check]
}

// probedNode starts agent a0 with its exec probes answered by a script
// in which the checks named in failing fail.
func probedNode(t *testing.T, failing ...string) (*testNode, *execScript) {
	t.Helper()
	n := start(t, "a0", t.TempDir(), nil)
	script := newExecScript(failing...)
	n.rt.exec = script.exec
	return n, script
}

// deployProbed applies a one-replica Deployment whose container has the
// given probes (nil: none).
func deployProbed(t *testing.T, n *testNode, name string, startup, liveness, readiness *corev1.Probe) {
	t.Helper()
	storeObjects(t, n, testDeployment(t, harness.App{Name: name, Replicas: 1, Container: "c", Image: "img:v1", Grace: harness.Seconds(1),
		Liveness: liveness, Readiness: readiness, Pod: func(p *corev1.PodSpec) { p.Containers[0].StartupProbe = startup }}))
}

// checkProbe is a probe running "check what" every second, failing after
// failures failed attempts (0: the default, 3).
func checkProbe(what string, failures int32) *corev1.Probe {
	return harness.ExecProbe(failures, "check", what)
}

// oneReplica returns the node's view of workload's only replica.
func oneReplica(n *testNode, workload string) (api.Replica, error) {
	for _, r := range n.agent.api.info.Replicas() {
		if r.Workload == workload {
			return r, nil
		}
	}
	return api.Replica{}, fmt.Errorf("no replica of %s", workload)
}

func (f *fakeRuntime) only() reconcile.Container {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.containers {
		return c
	}
	return reconcile.Container{}
}

func TestLivenessFailureRestartsThroughCrashBackoff(t *testing.T) {
	n, script := probedNode(t)
	deployProbed(t, n, "live", nil, checkProbe("live", 2), checkProbe("ready", 0))
	waitFor(t, 10*time.Second, func() error {
		r, err := oneReplica(n, "live")
		if err != nil || !r.Ready {
			return fmt.Errorf("not ready: %+v %v", r, err)
		}
		return nil
	})
	first := n.rt.only()
	script.set("live", true)
	failedAt := time.Now()
	// Two failures a second apart, then a stop and an immediate restart
	// (first restart: no backoff).
	waitFor(t, 10*time.Second, func() error {
		c := n.rt.only()
		if c.Restarts != 1 || c.State != reconcile.StateRunning {
			return fmt.Errorf("restarts %d state %s", c.Restarts, c.State)
		}
		return nil
	})
	t.Logf("restarted %v after the liveness check started failing", time.Since(failedAt).Round(time.Millisecond))
	script.set("live", false)
	second := n.rt.only()
	if !second.StartedAt.After(first.StartedAt) {
		t.Fatalf("not a new run: %v then %v", first.StartedAt, second.StartedAt)
	}
	// Fresh probe state: not ready until the readiness probe passes again.
	waitFor(t, 10*time.Second, func() error {
		r, err := oneReplica(n, "live")
		if err != nil || !r.Ready || r.Restarts != 1 {
			return fmt.Errorf("not ready after the restart: %+v %v", r, err)
		}
		return nil
	})
}

func TestLivenessStopRecordsReasonAndBacksOff(t *testing.T) {
	n, _ := probedNode(t, "live")
	deployProbed(t, n, "sick", nil, checkProbe("live", 1), nil)
	// Always failing: the first restart is at once, the second waits the
	// 10 s crash backoff, shown with the probe's reason.
	waitFor(t, 15*time.Second, func() error {
		r, err := oneReplica(n, "sick")
		if err != nil {
			return err
		}
		if r.Phase != api.PhaseCrashLoopBackOff || r.Restarts != 1 {
			return fmt.Errorf("phase %s restarts %d", r.Phase, r.Restarts)
		}
		if want := "liveness probe failed: command exited with code 1: live is failing"; r.Reason != want {
			return fmt.Errorf("reason %q, want %q", r.Reason, want)
		}
		return nil
	})
}

func TestStartupProbeHoldsLivenessAndReadiness(t *testing.T) {
	n, script := probedNode(t, "started", "live")
	deployProbed(t, n, "slow", checkProbe("started", 30), checkProbe("live", 1), checkProbe("ready", 0))
	waitFor(t, 10*time.Second, func() error {
		if script.count("started") < 3 {
			return fmt.Errorf("startup probe ran %d times", script.count("started"))
		}
		return nil
	})
	r, err := oneReplica(n, "slow")
	if err != nil {
		t.Fatal(err)
	}
	if r.Phase != api.PhaseRunning || r.Ready || !strings.HasPrefix(r.Reason, "startup probe has not succeeded yet") {
		t.Fatalf("during startup: %+v", r)
	}
	if l, rd := script.count("live"), script.count("ready"); l != 0 || rd != 0 {
		t.Fatalf("liveness ran %d and readiness %d times before the startup probe passed", l, rd)
	}
	// The liveness check would fail: it is passing by the time startup is.
	script.set("live", false)
	script.set("started", false)
	waitFor(t, 10*time.Second, func() error {
		r, err := oneReplica(n, "slow")
		if err != nil || !r.Ready || r.Reason != "" {
			return fmt.Errorf("not ready after startup: %+v %v", r, err)
		}
		return nil
	})
	startups := script.count("started")
	time.Sleep(2500 * time.Millisecond)
	if got := script.count("started"); got != startups {
		t.Fatalf("startup probe ran again after it passed (%d -> %d)", startups, got)
	}
	if script.count("live") < 2 || script.count("ready") < 2 {
		t.Fatalf("liveness %d and readiness %d runs after startup", script.count("live"), script.count("ready"))
	}
	if c := n.rt.only(); c.Restarts != 0 {
		t.Fatalf("restarted %d times", c.Restarts)
	}
}

func TestStartupProbeFailureRestarts(t *testing.T) {
	n, script := probedNode(t, "started")
	deployProbed(t, n, "never", checkProbe("started", 2), nil, nil)
	waitFor(t, 10*time.Second, func() error {
		if c := n.rt.only(); c.Restarts < 1 {
			return fmt.Errorf("restarts %d", c.Restarts)
		}
		return nil
	})
	if n := script.count("started"); n < 2 {
		t.Fatalf("restarted after %d startup probes, want 2", n)
	}
}
