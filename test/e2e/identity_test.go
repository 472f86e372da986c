package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// TestReappliedDeploymentDoesNotMeetItsPredecessor: a Deployment deleted
// and applied again at once gets new replicas (new names: the object has
// a new UID) that start without waiting for the old ones' grace period
// (15 s of SHUTDOWN_DELAY here), and whose logs are their own.
func TestReappliedDeploymentDoesNotMeetItsPredecessor(t *testing.T) {
	n1 := echoNode(t)
	manifest := harness.App{Name: "again", Namespace: "identity", Replicas: 2, Grace: harness.Seconds(20),
		Env: harness.Env("SHUTDOWN_DELAY", "15s"),
		Readiness: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
			PeriodSeconds: 1}}.Deployment()
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
