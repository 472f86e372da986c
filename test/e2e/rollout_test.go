package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// rolloutManifest is Deployment web running the echo image tag with
// MESSAGE=message, ready when /healthz answers.
func rolloutManifest(tag, message string) string {
	return harness.App{Name: "web", Replicas: 2, Image: "starling.local/echo:" + tag, Grace: harness.Seconds(3),
		Env: harness.Env("MESSAGE", message), Ports: harness.Port8080, Readiness: healthz8080()}.Deployment()
}

// rolledOut runs `rollout status` to completion and returns the one spec
// hash web's replicas then run.
func rolledOut(t *testing.T, n *harness.Node, args ...string) string {
	t.Helper()
	out, err := n.CLI(append([]string{"rollout", "status"}, append(args, "--timeout", "90s")...)...)
	if err != nil || !strings.HasSuffix(out, "deployment \"web\" successfully rolled out\n") {
		t.Fatalf("rollout status: %v\n%s", err, out)
	}
	all, err := replicas(n)
	if err != nil {
		t.Fatal(err)
	}
	hashes := map[string]bool{}
	for _, r := range all {
		if r.Workload != "web" {
			continue
		}
		if r.Phase != api.PhaseRunning || !r.Ready {
			t.Fatalf("rolled out, but %s is %s (ready %v)", r.Name, r.Phase, r.Ready)
		}
		hashes[r.SpecHash] = true
	}
	if len(hashes) != 1 {
		t.Fatalf("rolled out, but web runs hashes %v", hashes)
	}
	for h := range hashes {
		return h
	}
	return ""
}

// TestRolloutHistoryUndoRestartAndStatus walks the rollout commands on one
// node with real containers: two revisions, undo to the first, restart.
func TestRolloutHistoryUndoRestartAndStatus(t *testing.T) {
	c := newCluster(t, 1)
	n := c.Nodes[0]
	for _, tar := range []string{echoV1Tar, echoV2Tar} {
		if _, err := n.CLI("image", "import", tar); err != nil {
			t.Fatal(err)
		}
	}
	apply(t, n, rolloutManifest("v1", "one"))
	h1 := rolledOut(t, n, "deployment/web")
	apply(t, n, rolloutManifest("v2", "two"))
	h2 := rolledOut(t, n, "deployment", "web")
	if h2 == h1 {
		t.Fatalf("new image and env kept hash %s", h1)
	}

	out, err := n.CLI("rollout", "history", "deployment/web")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || lines[0] != "deployment.apps/web" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[2]), " "), "1 "+h1+" starling.local/echo:v1 <none>") ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[3]), " "), "2 "+h2+" starling.local/echo:v2 <none>") {
		t.Fatalf("history, want revisions 1 (%s) and 2 (%s):\n%s", h1, h2, out)
	}

	// Undo: revision 1's template, hash and message come back.
	if out, err := n.CLI("rollout", "undo", "deployment/web"); err != nil || out != "deployment.apps/web rolled back\n" {
		t.Fatalf("undo: %q %v", out, err)
	}
	if got := rolledOut(t, n, "deployment/web"); got != h1 {
		t.Fatalf("after undo web runs %s, want revision 1's %s", got, h1)
	}
	reps, _ := waitRunning(t, n, "web", 2, 10*time.Second)
	body, err := harness.HTTPGet(n.NetNS, "http://"+reps[0].PodIP+":8080/", 2*time.Second)
	if err != nil || !strings.Contains(body, "message=one") {
		t.Fatalf("after undo a replica answered %q, %v", body, err)
	}
	out, err = n.CLI("rollout", "history", "deployment/web", "--revision", "3")
	if err != nil || !strings.Contains(out, "revision 3, spec hash "+h1) || !strings.Contains(out, "image: starling.local/echo:v1") {
		t.Fatalf("history --revision 3 (revision 1 renumbered): %v\n%s", err, out)
	}
	if _, err := n.CLI("rollout", "undo", "deployment/web", "--to-revision", "1"); err == nil ||
		!strings.Contains(err.Error(), "unable to find revision 1 in history (recorded: 2, 3)") {
		t.Fatalf("undo to a renumbered revision: %v", err)
	}

	// Restart: same template, a new hash, fresh replicas.
	if out, err := n.CLI("rollout", "restart", "deployment", "web"); err != nil || out != "deployment.apps/web restarted\n" {
		t.Fatalf("restart: %q %v", out, err)
	}
	h4 := rolledOut(t, n, "deployment/web")
	if h4 == h1 || h4 == h2 {
		t.Fatalf("restart kept an old hash: %s", h4)
	}
	if _, err := n.CLI("rollout", "status", "web"); err == nil || !strings.Contains(err.Error(), "deployment/web or deployment web") {
		t.Fatalf("status without a kind: %v", err)
	}

	// An apply keeps what other commands set (kubectl's three-way
	// merge): the same file applied after a restart changes nothing
	// and rolls nothing.
	apply(t, n, rolloutManifest("v1", "one"))
	h5 := rolledOut(t, n, "deployment/web")
	if _, err := n.CLI("rollout", "restart", "deployment", "web"); err != nil {
		t.Fatal(err)
	}
	h6 := rolledOut(t, n, "deployment/web")
	if out, err := n.CLIInput(strings.NewReader(rolloutManifest("v1", "one")), "apply", "-f", "-"); err != nil || out != "deployment.apps/web unchanged\n" {
		t.Fatalf("the same file after a restart: %q %v, want unchanged", out, err)
	}
	if got := rolledOut(t, n, "deployment/web"); got != h6 || h6 == h5 {
		t.Fatalf("after the re-apply web runs %s, want the restart's %s (before it %s)", got, h6, h5)
	}
}
