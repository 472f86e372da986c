package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// TestStatefulReplicaNeverRunsTwiceWhenItsAgentHangs: the agent of the
// node that runs a StatefulSet replica is stopped (SIGSTOP) for 45 s, then
// killed for 45 s. Its peers see it dead either way and start the ordinal
// elsewhere after --failover-timeout; the fence watchdog, which outlives
// the agent, kills the old copy before that. Sampled every 100 ms from
// every node's cgroups (the kernel's word, not an agent's): never two
// copies; afterwards exactly one.
func TestStatefulReplicaNeverRunsTwiceWhenItsAgentHangs(t *testing.T) {
	c := newCluster(t, 3)
	n1 := c.Nodes[0]
	importEcho(t, n1)
	waitReadyNodes(t, n1, 3)
	apply(t, n1, harness.App{Name: "solo", Namespace: "fence", Replicas: 1, Grace: harness.Seconds(2),
		Ports: harness.Port8080}.StatefulSet("solo"))
	const id = "fence_solo-0"
	host := func() *harness.Node {
		t.Helper()
		var on []string
		waitFor(t, 120*time.Second, func() error {
			on = runningCopies(c.Nodes, id)[id]
			if len(on) != 1 {
				return fmt.Errorf("%s runs on %v, want one node", id, on)
			}
			return nil
		})
		for _, n := range c.Nodes {
			if n.Name == on[0] {
				return n
			}
		}
		t.Fatalf("unknown node %s", on[0])
		return nil
	}
	for _, hang := range []string{"SIGSTOP", "SIGKILL"} {
		h := host()
		w := watchDuplicates(c.Nodes, id)
		start := time.Now()
		if hang == "SIGSTOP" {
			if err := h.SignalAgent(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
		} else {
			h.KillAgent(syscall.SIGKILL)
		}
		// Elsewhere within 45 s, and the old copy dead before that.
		var moved string
		_, err := eventually(45*time.Second, func() error {
			on := runningCopies(c.Nodes, id)[id]
			if len(on) == 1 && on[0] != h.Name {
				moved = on[0]
				return nil
			}
			return fmt.Errorf("%s runs on %v", id, on)
		})
		if err != nil {
			t.Fatalf("%s on %s's agent: %v", hang, h.Name, err)
		}
		t.Logf("%s on %s's agent: %s runs on %s after %v", hang, h.Name, id, moved, time.Since(start).Round(100*time.Millisecond))
		time.Sleep(time.Until(start.Add(45 * time.Second)))
		if hang == "SIGSTOP" {
			if err := h.SignalAgent(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		} else if err := h.RestartAgent(); err != nil {
			t.Fatal(err)
		}
		waitReadyNodes(t, n1, 3)
		time.Sleep(10 * time.Second) // the agent is back: it must not start its old copy again
		if on := runningCopies(c.Nodes, id)[id]; len(on) != 1 {
			t.Fatalf("after %s's agent came back: %s runs on %v, want exactly one node", h.Name, id, on)
		}
		dups, samples := w.finish()
		if len(dups) > 0 {
			t.Fatalf("%s on %s's agent: two copies of %s in %d of %d samples: %v", hang, h.Name, id, len(dups), samples, dups[:min(5, len(dups))])
		}
		log, _ := os.ReadFile(filepath.Join(h.DataDir, "fence-watchdog.log"))
		if !strings.Contains(string(log), "killed the processes of its StatefulSet replicas") {
			t.Fatalf("%s's fence watchdog did not act:\n%s", h.Name, log)
		}
		t.Logf("%s: %d samples over %v, never two copies", hang, samples, time.Since(start).Round(time.Second))
	}
}
