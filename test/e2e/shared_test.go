package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/test/harness"
)

// echoApp is the App of deployment(name, replicas, message), for a test
// that changes more of it (a namespace, a node selector).
func echoApp(name string, replicas int32, message string) harness.App {
	return harness.App{Name: name, Replicas: replicas, Grace: harness.Seconds(3), Env: harness.Env("MESSAGE", message),
		Ports: harness.Port8080, Limits: harness.Limits("memory", "48Mi", "cpu", "250m")}
}

// healthz8080 is a readiness probe of /healthz on port 8080 (by number),
// every second.
func healthz8080() *corev1.Probe {
	p := harness.HTTPProbe("/healthz", 0)
	p.HTTPGet.Port = intstr.FromInt32(8080)
	return p
}

// every calls f every period, in a goroutine of its own, until the
// returned stop is called; stop waits for a call under way and may be
// called again.
func every(period time.Duration, f func()) (stop func()) {
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			f()
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}
}

// nsenter starts nsenter with args (a program in a node's network
// namespace) and returns what it writes; it is stopped at cleanup, its
// output then logged under title unless title is "".
func nsenter(t *testing.T, title string, args ...string) *syncWriter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	out := &syncWriter{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if title != "" {
			t.Logf("%s:\n%s", title, out)
		}
	})
	return out
}

// waitHeld waits until every one of observers holds the member name in
// state, at address addr unless addr is "".
func waitHeld(t *testing.T, timeout time.Duration, observers []*harness.Node, name, state, addr string) {
	t.Helper()
	waitFor(t, timeout, func() error {
		for _, n := range observers {
			nodes, err := n.API().Nodes(context.Background())
			if err != nil {
				return err
			}
			held := false
			for _, m := range nodes {
				held = held || m.Name == name && m.State == state && (addr == "" || m.Address == addr)
			}
			if !held && addr != "" {
				return fmt.Errorf("%s does not hold %s %s at %s yet: %+v", n.Name, name, state, addr, nodes)
			}
			if !held {
				return fmt.Errorf("%s does not hold %s %s yet: %+v", n.Name, name, state, nodes)
			}
		}
		return nil
	})
}
