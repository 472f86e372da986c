package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

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
	stopper := func(name, image string, grace int64) string {
		return harness.App{Name: name, Replicas: 1, Image: image, Grace: harness.Seconds(grace),
			Env: harness.Env("SHUTDOWN_DELAY", "1500ms"), Ports: harness.Port8080}.Deployment()
	}
	apply(t, n1, stopper("quit", "starling.local/echo:quit", 10))
	apply(t, n1, stopper("term", harness.EchoImage, 10))
	apply(t, n1, stopper("zero", harness.EchoImage, 0))
	ips := waitReadyIPs(t, n1, "quit", "term", "zero")
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

// TestLifecycleHooksRunAsTheKubeletRunsThem: postStart runs in the
// container right after its start (its readiness probe waits for the
// file the hook has the server write); a failing postStart stops the run
// with FailedPostStartHook and the container restarts; on delete,
// preStop runs before the stop signal: an exec hook (the server turns
// sick before it gets SIGTERM) and a sleep (the server sees no signal
// for the sleep's length).
func TestLifecycleHooksRunAsTheKubeletRunsThem(t *testing.T) {
	n1 := echoNode(t)
	hooked := func(name string, grace int64, lifecycle *corev1.Lifecycle, readiness *corev1.Probe) string {
		return harness.App{Name: name, Replicas: 1, Grace: harness.Seconds(grace), Env: harness.Env("SHUTDOWN_DELAY", "1500ms"),
			Ports: harness.HTTPPort, Readiness: readiness,
			Pod: func(spec *corev1.PodSpec) { spec.Containers[0].Lifecycle = lifecycle }}.Deployment()
	}
	exec := func(command ...string) *corev1.LifecycleHandler {
		return &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: command}}
	}
	apply(t, n1, hooked("hooked", 10, &corev1.Lifecycle{
		PostStart: exec("/echo", "check", "-sleep", "1s", "-get", "http://127.0.0.1:8080/set?file=started"),
		PreStop:   exec("/echo", "check", "-get", "http://127.0.0.1:8080/sick", "-linger", "2s")},
		harness.ExecProbe(0, "/echo", "check", "-exists", "/tmp/started")))
	apply(t, n1, hooked("sleeper", 10, &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 3}}}, nil))
	apply(t, n1, hooked("failing", 2, &corev1.Lifecycle{
		PostStart: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("http"), Path: "/set"}}}, nil))

	// hooked is ready only once its postStart hook ran.
	ips := waitReadyIPs(t, n1, "hooked", "sleeper")
	// The failing hook: a GET the server answers 400.
	waitFor(t, 60*time.Second, func() error {
		out, err := n1.CLI("get", "replicas", "-o", "json")
		if err != nil {
			return err
		}
		var l struct {
			Items []struct {
				Workload  string          `json:"workload"`
				Restarts  int             `json:"restarts"`
				Reason    string          `json:"reason"`
				LastState json.RawMessage `json:"lastState"`
			}
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			return err
		}
		for _, r := range l.Items {
			if r.Workload != "failing" {
				continue
			}
			all := r.Reason + " " + string(r.LastState)
			// The hook's GET answered 400, or came before the server
			// listened (it runs beside the entrypoint, as the
			// kubelet's does): either way its failure is the reason.
			if r.Restarts < 1 || !strings.Contains(all, "FailedPostStartHook: GET /set port 8080") ||
				!strings.Contains(all, "HTTP 400") && !strings.Contains(all, "connection refused") {
				return fmt.Errorf("failing: restarts %d, reason %q", r.Restarts, all)
			}
			t.Logf("failing postStart: restarts %d, %s", r.Restarts, all)
			return nil
		}
		return fmt.Errorf("no replica of failing:\n%s", out)
	})

	deleted := time.Now()
	for _, w := range []string{"hooked", "sleeper"} {
		if _, err := n1.CLI("delete", "deployment", w); err != nil {
			t.Fatal(err)
		}
	}
	get := func(ip, path string) (string, error) {
		return harness.HTTPGet(n1.NetNS, "http://"+ip+":8080"+path, 500*time.Millisecond)
	}
	var sickBeforeSignal bool
	var sleeperSignalAt time.Duration
	var hookedSignal string
	for time.Since(deleted) < 20*time.Second && (hookedSignal == "" || sleeperSignalAt == 0) {
		if hookedSignal == "" {
			_, livez := get(ips["hooked"], "/livez")
			sig, err := get(ips["hooked"], "/signal")
			if err == nil && sig == "" && livez != nil && strings.Contains(livez.Error(), "500 Internal Server Error") {
				sickBeforeSignal = true // preStop ran, no signal yet
			}
			if err == nil {
				hookedSignal = sig
			}
		}
		if sleeperSignalAt == 0 {
			if sig, err := get(ips["sleeper"], "/signal"); err == nil && sig != "" {
				sleeperSignalAt = time.Since(deleted)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !sickBeforeSignal || hookedSignal != "terminated" {
		t.Errorf("hooked: preStop seen before the signal %v, signal %q (want the exec hook to run first, then SIGTERM)", sickBeforeSignal, hookedSignal)
	}
	if sleeperSignalAt < 2500*time.Millisecond || sleeperSignalAt > 8*time.Second {
		t.Errorf("sleeper: stop signal %v after delete, want after its 3 s preStop sleep", sleeperSignalAt)
	}
	t.Logf("preStop exec ran before SIGTERM; preStop sleep 3s: signal %v after delete", sleeperSignalAt.Round(100*time.Millisecond))
}

// waitReadyIPs waits until every workload of want has a ready replica on
// n and returns the pod IPs of ready replicas, by workload.
func waitReadyIPs(t *testing.T, n *harness.Node, want ...string) map[string]string {
	t.Helper()
	ips := map[string]string{}
	waitFor(t, 60*time.Second, func() error {
		items, err := apiReplicas(n)
		if err != nil {
			return err
		}
		for _, r := range items {
			if r.Ready && r.PodIP != "" {
				ips[r.Workload] = r.PodIP
			}
		}
		for _, w := range want {
			if ips[w] == "" {
				return fmt.Errorf("%s not ready: %v", w, ips)
			}
		}
		return nil
	})
	return ips
}
