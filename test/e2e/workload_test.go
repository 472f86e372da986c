package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// deployment is the Deployment most tests run: replicas copies of the
// echo server answering message, with a 3 s grace period and limits.
func deployment(name string, replicas int, message string) string {
	return harness.App{Name: name, Replicas: int32(replicas), Grace: harness.Seconds(3), Env: harness.Env("MESSAGE", message),
		Ports: harness.Port8080, Limits: harness.Limits("memory", "48Mi", "cpu", "250m")}.Deployment()
}

// apply applies manifest on n, failing the test on an error.
func apply(t *testing.T, n *harness.Node, manifest string) {
	t.Helper()
	if _, err := n.CLIInput(strings.NewReader(manifest), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// importEcho imports the echo image (harness.EchoImage) on each node.
func importEcho(t *testing.T, nodes ...*harness.Node) {
	t.Helper()
	for _, n := range nodes {
		if _, err := n.CLI("image", "import", echoV1Tar); err != nil {
			t.Fatal(err)
		}
	}
}

// TestScaleKeepsOtherReplicasAndSpecChangeReplaces guards the two kinds of
// Deployment change: replicas alone adds or removes ordinals without
// touching the rest; a spec change replaces every replica.
func TestScaleKeepsOtherReplicasAndSpecChangeReplaces(t *testing.T) {
	c := newCluster(t, 1)
	n := c.Nodes[0]
	if _, err := n.CLI("image", "import", echoV1Tar); err != nil {
		t.Fatal(err)
	}
	apply(t, n, deployment("web", 2, "one"))
	reps, _ := waitRunning(t, n, "web", 2, 10*time.Second)
	hash := reps[0].SpecHash
	before := taskPIDs(t, n)

	// Limits reached the cgroup (cgroup v1 memory controller, or v2).
	id := "default_" + reps[0].Name
	limit, err := os.ReadFile("/sys/fs/cgroup/memory/starling/" + n.CgroupName() + "/" + id + "/memory.limit_in_bytes")
	if err != nil {
		limit, err = os.ReadFile("/sys/fs/cgroup/starling/" + n.CgroupName() + "/" + id + "/memory.max")
	}
	if err != nil || strings.TrimSpace(string(limit)) != fmt.Sprint(48<<20) {
		t.Fatalf("memory limit of %s: %q %v, want %d", id, limit, err, 48<<20)
	}

	if out, err := n.CLI("scale", "deployment/web", "--replicas", "4"); err != nil || !strings.Contains(out, "scaled") {
		t.Fatalf("scale: %q %v", out, err)
	}
	waitRunning(t, n, "web", 4, 10*time.Second)
	after := taskPIDs(t, n)
	for id, pids := range before {
		if after[id] != pids {
			t.Fatalf("scale up touched %s: %s -> %s", id, pids, after[id])
		}
	}
	apply(t, n, deployment("web", 1, "one")) // scale down by apply
	waitRunning(t, n, "web", 1, 15*time.Second)
	if got := taskPIDs(t, n)["default_web-"+hash+"-0"]; got != before["default_web-"+hash+"-0"] {
		t.Fatalf("scale down touched ordinal 0: %s -> %s", before["default_web-"+hash+"-0"], got)
	}

	apply(t, n, deployment("web", 1, "two")) // env change: new spec hash
	var newReps []replica
	_, err = eventually(15*time.Second, func() error {
		all, err := replicas(n)
		if err != nil {
			return err
		}
		newReps = nil
		for _, r := range all {
			if r.Workload == "web" {
				newReps = append(newReps, r)
			}
		}
		if len(newReps) != 1 || newReps[0].SpecHash == hash || newReps[0].Phase != api.PhaseRunning {
			return fmt.Errorf("replicas: %+v", newReps)
		}
		return nil
	})
	if err != nil {
		t.Fatal("spec change did not replace the replica: ", err)
	}
	// Running is not ready (probes come later): give the server a moment.
	var body string
	_, err = eventually(3*time.Second, func() error {
		body, err = harness.HTTPGet(n.NetNS, "http://"+newReps[0].PodIP+":8080/", time.Second)
		return err
	})
	if err != nil || !strings.Contains(body, "message=two") {
		t.Fatalf("replaced replica answered %q, %v", body, err)
	}
}

// TestTCPAPIRequiresTokenAndServesLogsAndMetrics checks the TCP API: no
// token, no access; with the token the CLI works; logs come from the
// replica's stdout; /metrics reports reconcile figures.
func TestTCPAPIRequiresTokenAndServesLogsAndMetrics(t *testing.T) {
	c := newCluster(t, 1)
	n := c.Nodes[0]
	token := c.Token
	if _, err := n.CLI("image", "import", echoV1Tar); err != nil {
		t.Fatal(err)
	}
	apply(t, n, deployment("logme", 1, "x"))
	reps, _ := waitRunning(t, n, "logme", 1, 10*time.Second)

	url := n.APIURL()
	client, err := c.APIClient() // TLS, checked against the cluster CA
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Get(url + "/v1/replicas")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: status %d, want 401", resp.StatusCode)
	}
	// The gauge is set at each reconcile pass: poll until it shows the replica.
	_, err = eventually(10*time.Second, func() error {
		req, _ := http.NewRequest("GET", url+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		for _, m := range []string{"starling_reconcile_duration_seconds_count", `starling_replicas{phase="Running"} 1`, "starling_replica_restarts_total"} {
			if !strings.Contains(string(b), m) {
				return fmt.Errorf("metrics lack %q", m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The CLI from the LAN side, with the client config 'starling config'
	// writes on the node: TLS checked against the CA pin, and the token.
	cfg := filepath.Join(t.TempDir(), "config")
	if out, err := n.CLI("config", "-o", cfg); err != nil || !strings.Contains(out, "server "+url) {
		t.Fatalf("starling config: %q %v", out, err)
	}
	if fi, err := os.Stat(cfg); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("client config mode: %v %v", fi, err)
	}
	out, err := harness.NetNSExec(t.Context(), c.LAN, binary, "--config", cfg, "logs", reps[0].Name)
	if err != nil || !strings.Contains(out, "echo listening on :8080 as "+reps[0].Name) {
		t.Fatalf("logs over TCP: %q %v", out, err)
	}
	if _, err := harness.NetNSExec(t.Context(), c.LAN, binary, "--config", cfg, "--token", "wrong-token-xxxxxxxx", "get", "replicas"); err == nil || !strings.Contains(err.Error(), "bearer token") {
		t.Fatalf("wrong token: %v", err)
	}
	// Without the pin the CLI refuses to speak TLS blind; with another
	// CA's pin it refuses the node; plain HTTP gets nothing.
	if _, err := harness.NetNSExec(t.Context(), c.LAN, binary, "--server", url, "--token", token, "get", "replicas"); err == nil || !strings.Contains(err.Error(), "starling config") {
		t.Fatalf("https without a pin: %v", err)
	}
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pin, err := c.CAPin()
	if err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(wrong, []byte(strings.Replace(string(b), pin, strings.Repeat("f", 64), 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := harness.NetNSExec(t.Context(), c.LAN, binary, "--config", wrong, "get", "replicas"); err == nil || !strings.Contains(err.Error(), "does not chain to the pinned cluster CA") {
		t.Fatalf("another CA's pin: %v", err)
	}
	if _, err := harness.NetNSExec(t.Context(), c.LAN, binary, "--server", strings.Replace(url, "https://", "http://", 1), "--token", token, "get", "replicas"); err == nil {
		t.Fatal("plain HTTP to the TLS API answered")
	}
}

// echoNode starts a cluster of one node (with agentArgs) that has the
// echo image, the start of most single-node tests.
func echoNode(t *testing.T, agentArgs ...string) *harness.Node {
	t.Helper()
	n := newCluster(t, 1, agentArgs...).Nodes[0]
	importEcho(t, n)
	return n
}
