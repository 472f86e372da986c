package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

// TestStopsAsTheKubeletDoes: a replica is stopped with its image's
// StopSignal (SIGQUIT here, as nginx's image says), SIGTERM when the image
// names none, and a terminationGracePeriodSeconds of 0 still sends the
// signal and waits the kubelet's minimum (2 s) before SIGKILL. The echo
// server keeps serving SHUTDOWN_DELAY after the signal and answers GET
// /signal with the one it got.
func TestStopsAsTheKubeletDoes(t *testing.T) {
	c := newCluster(t, 1)
	n1 := c.Nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mod, err := harness.ModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	tar := filepath.Join(t.TempDir(), "quit.tar")
	if err := imagebuild.EchoWith(ctx, mod, imagebuild.Spec{Ref: "starling.local/echo:quit", StopSignal: "SIGQUIT"}, tar); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{tar, echoV1Tar} {
		if _, err := n1.CLI("image", "import", f); err != nil {
			t.Fatal(err)
		}
	}
	stopper := func(name, image string, grace int) string {
		return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %s}
spec:
  replicas: 1
  selector: {matchLabels: {app: %s}}
  template:
    metadata: {labels: {app: %s}}
    spec:
      terminationGracePeriodSeconds: %d
      containers:
      - name: echo
        image: %s
        env: [{name: SHUTDOWN_DELAY, value: 1500ms}]
        ports: [{containerPort: 8080}]
`, name, name, name, grace, image)
	}
	apply(t, n1, stopper("quit", "starling.local/echo:quit", 10))
	apply(t, n1, stopper("term", "starling.local/echo:v1", 10))
	apply(t, n1, stopper("zero", "starling.local/echo:v1", 0))
	ips := map[string]string{}
	waitFor(t, 60*time.Second, func() error {
		items, err := apiReplicas(n1)
		if err != nil {
			return err
		}
		for _, r := range items {
			if r.Ready && r.PodIP != "" {
				ips[r.Workload] = r.PodIP
			}
		}
		if len(ips) != 3 {
			return fmt.Errorf("ready: %v", ips)
		}
		return nil
	})
	for _, w := range []string{"quit", "term", "zero"} {
		if _, err := n1.CLI("delete", "deployment", w); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{"quit": "quit", "term": "terminated", "zero": "terminated"}
	got := map[string]string{}
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < 3 && time.Now().Before(deadline) {
		for w, ip := range ips {
			if got[w] != "" {
				continue
			}
			if body, err := harness.HTTPGet(n1.NetNS, "http://"+ip+":8080/signal", 500*time.Millisecond); err == nil && body != "" {
				got[w] = body
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for w, sig := range want {
		if got[w] != sig {
			t.Errorf("%s: the server got signal %q, want %q (all: %v)", w, got[w], sig, got)
		}
	}
}
