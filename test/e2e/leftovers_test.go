package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/runtime"
)

// TestCreateAfterAnInterruptedOne: an agent killed in the middle of a
// create leaves the container's snapshot without the container (the
// rolling-update test hit it: every retry then failed with "snapshot
// already exists", and the replica never ran). The next create removes
// the leftover and the replica runs.
func TestCreateAfterAnInterruptedOne(t *testing.T) {
	n1 := echoNode(t)
	left := echoApp("left", 0, "x")
	left.Namespace = "leftovers"
	apply(t, n1, left.Deployment())
	var hash string
	waitFor(t, 30*time.Second, func() error {
		out, err := n1.CLI("describe", "deployment", "left", "-n", "leftovers")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Spec hash:"); ok {
				hash = strings.TrimSpace(v)
				return nil
			}
		}
		return fmt.Errorf("no spec hash in describe:\n%s", out)
	})
	// What a create cut short leaves: the snapshot, no container.
	client, err := containerd.New(n1.ContainerdSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), runtime.Namespace), 30*time.Second)
	defer cancel()
	// containerd's client creates it under a lease that outlives the
	// agent (24 h), so the garbage collector does not take it.
	lease, err := client.LeasesService().Create(ctx, leases.WithRandomID(), leases.WithExpiration(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	id := "leftovers_left-" + hash + "-0"
	if _, err := client.SnapshotService("overlayfs").Prepare(leases.WithLease(ctx, lease.ID), id, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.CLI("scale", "deployment/left", "-n", "leftovers", "--replicas", "1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() error {
		items, err := apiReplicas(n1)
		if err != nil {
			return err
		}
		for _, r := range items {
			if r.Workload == "left" && r.Phase == api.PhaseRunning {
				return nil
			}
		}
		return fmt.Errorf("not running: %+v", items)
	})
}
