package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// TestEveryStartIsCounted: three Deployments of 4 applied at once (the
// report: 5 of 12 replicas were started 2-4 times with RESTARTS 0, a
// create or start finishing between a reconcile's list and its actions).
// For every replica, the starts seen in its logs are RESTARTS + 1: the
// current run's log says "echo listening" once, and a replica that never
// restarted has no previous run.
func TestEveryStartIsCounted(t *testing.T) {
	n1 := echoNode(t)
	var all []string
	for _, name := range []string{"r1", "r2", "r3"} {
		all = append(all, harness.App{Name: name, Namespace: "race", Replicas: 4, Grace: harness.Seconds(1),
			Readiness: healthz8080()}.Deployment())
	}
	apply(t, n1, harness.Manifests(all...))
	var reps []replica
	waitFor(t, 90*time.Second, func() error {
		items, err := apiReplicas(n1)
		if err != nil {
			return err
		}
		reps = reps[:0]
		for _, r := range items {
			if r.Namespace == "race" {
				reps = append(reps, r)
			}
		}
		ready := 0
		for _, r := range reps {
			if r.Ready {
				ready++
			}
		}
		if len(reps) != 12 || ready != 12 {
			return fmt.Errorf("%d replicas, %d ready, want 12 ready", len(reps), ready)
		}
		return nil
	})
	restarted := 0
	for _, r := range reps {
		cur, err := n1.CLI("logs", "-n", "race", r.Name)
		if err != nil {
			t.Fatal(err)
		}
		starts := strings.Count(cur, "echo listening")
		prev, perr := n1.CLI("logs", "-n", "race", "--previous", r.Name)
		if perr == nil {
			starts += strings.Count(prev, "echo listening")
		}
		if strings.Count(cur, "echo listening") != 1 || r.Restarts == 0 && perr == nil || r.Restarts > 0 && perr != nil {
			t.Errorf("%s: RESTARTS %d, current run started %d times, previous run: %v", r.Name, r.Restarts, strings.Count(cur, "echo listening"), perr == nil)
		}
		if r.Restarts > 0 {
			restarted++
			t.Logf("%s: RESTARTS %d, starts seen %d", r.Name, r.Restarts, starts)
		}
	}
	t.Logf("12 replicas of 3 Deployments applied at once: %d restarted, every start counted", restarted)
}
