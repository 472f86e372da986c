package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
)

// TestReappliedDeploymentDoesNotMeetItsPredecessor: a Deployment deleted
// and applied again at once gets new replicas (new names: the object has
// a new UID) that start without waiting for the old ones' grace period
// (15 s of SHUTDOWN_DELAY here), and whose logs are their own.
func TestReappliedDeploymentDoesNotMeetItsPredecessor(t *testing.T) {
	c := newCluster(t, 1)
	n1 := c.Nodes[0]
	if _, err := n1.CLI("image", "import", echoV1Tar); err != nil {
		t.Fatal(err)
	}
	const manifest = `apiVersion: apps/v1
kind: Deployment
metadata: {name: again, namespace: identity}
spec:
  replicas: 2
  selector: {matchLabels: {app: again}}
  template:
    metadata: {labels: {app: again}}
    spec:
      terminationGracePeriodSeconds: 20
      containers:
      - name: echo
        image: starling.local/echo:v1
        env: [{name: SHUTDOWN_DELAY, value: 15s}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
`
	apply(t, n1, manifest)
	ready := func() (map[string]bool, error) {
		items, err := apiReplicas(n1)
		if err != nil {
			return nil, err
		}
		out := map[string]bool{}
		for _, r := range items {
			if r.Namespace == "identity" && r.Ready && r.Phase == api.PhaseRunning {
				out[r.Name] = true
			}
		}
		return out, nil
	}
	var first map[string]bool
	waitFor(t, 60*time.Second, func() (err error) {
		if first, err = ready(); err == nil && len(first) != 2 {
			err = fmt.Errorf("ready: %v", first)
		}
		return err
	})
	if _, err := n1.CLI("delete", "deployment", "again", "-n", "identity"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	apply(t, n1, manifest)
	var second map[string]bool
	waitFor(t, 60*time.Second, func() (err error) {
		second, err = ready()
		if err != nil {
			return err
		}
		for name := range first {
			delete(second, name)
		}
		if len(second) != 2 {
			return fmt.Errorf("new replicas ready: %v (old: %v)", second, first)
		}
		return nil
	})
	took := time.Since(start)
	if took > 10*time.Second {
		t.Errorf("the new replicas were ready %v after the re-apply: they waited for the old ones' 15 s shutdown", took)
	}
	for name := range second {
		out, err := n1.CLI("logs", "-n", "identity", name)
		if err != nil || strings.Count(out, "echo listening") != 1 || strings.Contains(out, "got signal") {
			t.Errorf("logs of new replica %s: %q %v (want its own start only)", name, out, err)
		}
	}
	t.Logf("deleted and applied again: new replicas %v ready %v later, old %v stopping", keys(second), took.Round(100*time.Millisecond), keys(first))
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
