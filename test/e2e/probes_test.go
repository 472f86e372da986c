package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// replicaOf returns the replica named name of workload as n reports it
// (an empty name or workload matches any).
func replicaOf(n *harness.Node, workload, name string) (replica, error) {
	all, err := replicas(n)
	if err != nil {
		return replica{}, err
	}
	for _, r := range all {
		if (workload == "" || r.Workload == workload) && (name == "" || r.Name == name) {
			return r, nil
		}
	}
	return replica{}, fmt.Errorf("no replica %s of %s in %+v", name, workload, all)
}

// replicaReason is the REASON of replica name as n reports it.
func replicaReason(n *harness.Node, name string) (string, error) {
	r, err := replicaOf(n, "", name)
	return r.Reason, err
}

// probeMean reads node n's starling_probe_duration_seconds for one probe
// kind and handler from its metrics: the mean and the count.
func probeMean(t *testing.T, c *harness.Cluster, n *harness.Node, kind, handler string) (time.Duration, int) {
	t.Helper()
	api, err := c.TCPClient(n)
	if err != nil {
		t.Fatal(err)
	}
	text, err := api.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	labels := fmt.Sprintf(`{handler=%q,probe=%q}`, handler, kind)
	var sum float64
	var count int
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "starling_probe_duration_seconds_sum"+labels+" "); ok {
			sum, _ = strconv.ParseFloat(v, 64)
		}
		if v, ok := strings.CutPrefix(line, "starling_probe_duration_seconds_count"+labels+" "); ok {
			count, _ = strconv.Atoi(v)
		}
	}
	if count == 0 {
		return 0, 0
	}
	return time.Duration(sum / float64(count) * float64(time.Second)), count
}

// nodeOf returns the cluster node called name.
func nodeOf(c *harness.Cluster, name string) *harness.Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// checkProcs counts the processes running "/echo check" in container id
// on node n (exec probes still running).
func checkProcs(n *harness.Node, id string) (int, string) {
	count := 0
	var states []string
	for _, pid := range n.TaskPIDs()[id] {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.HasPrefix(string(b), "/echo\x00check") {
			count++
			stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			states = append(states, strings.TrimSpace(string(stat)))
		}
	}
	return count, strings.Join(states, "; ")
}

// TestExecReadinessProbeOnEveryNode: exec readiness probes run inside the
// containers through each node's own containerd: every replica, on every
// node, becomes ready and a Service endpoint; one whose command fails
// leaves every node's rules and comes back when it passes; a command that
// outlives timeoutSeconds fails and is killed.
func TestExecReadinessProbeOnEveryNode(t *testing.T) {
	c := newCluster(t, 3)
	n1 := c.Nodes[0]
	importEcho(t, n1)
	// Placement spreads over the nodes n1 knows to be alive and ready.
	waitReadyNodes(t, n1, 3)
	execready := harness.App{Name: "execready", Replicas: 3, Grace: harness.Seconds(1), Ports: harness.HTTPPort,
		Readiness: harness.ExecProbe(1, "/echo", "check", "-absent", "/tmp/unready")}
	apply(t, n1, harness.Manifests(execready.Deployment(),
		execready.Service("execready", []corev1.ServicePort{harness.ServicePort(80, "http")})))
	inRules := func(ip string, want bool) error {
		for _, n := range c.Nodes {
			dest, err := n.ServiceDestinations(t.Context())
			if err != nil {
				return err
			}
			if has := dest[ip+":8080"]; has != want {
				return fmt.Errorf("%s: endpoint %s in rules = %v, want %v", n.Name, ip, has, want)
			}
		}
		return nil
	}
	var ready []replica
	took, err := eventually(90*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		ready = nil
		for _, r := range all {
			if r.Workload == "execready" && r.Ready {
				ready = append(ready, r)
			}
		}
		if len(ready) != 3 {
			return fmt.Errorf("%d of 3 replicas ready: %+v", len(ready), all)
		}
		for _, r := range ready {
			if err := inRules(r.PodIP, true); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for _, r := range ready {
		perNode[r.Node]++
	}
	t.Logf("3 replicas ready through exec probes and in every node's rules %v after apply; per node: %s", took.Round(time.Millisecond), fmtCounts(perNode))
	if len(perNode) < 2 {
		t.Fatalf("replicas on %d node(s), want them spread: %v", len(perNode), perNode)
	}
	// Flip one replica on a node other than the one applied to.
	target := ready[0]
	for _, r := range ready {
		if r.Node != n1.Name {
			target = r
		}
	}
	owner := nodeOf(c, target.Node)
	if _, err := harness.HTTPGet(owner.NetNS, "http://"+target.PodIP+":8080/unready", time.Second); err != nil {
		t.Fatal(err)
	}
	took, err = eventually(15*time.Second, func() error {
		r, err := replicaOf(n1, "execready", target.Name)
		if err != nil || r.Ready {
			return fmt.Errorf("still ready: %+v %v", r, err)
		}
		return inRules(target.PodIP, false)
	})
	if err != nil {
		t.Fatal("failing exec readiness: ", err)
	}
	t.Logf("exec check failing on %s: not ready and out of every node's rules in %v", owner.Name, took.Round(time.Millisecond))
	reason, err := replicaReason(n1, target.Name)
	if want := "readiness probe failed: command exited with code 1: /tmp/unready exists"; err != nil || reason != want {
		t.Fatalf("reason %q (%v), want %q", reason, err, want)
	}
	if _, err := harness.HTTPGet(owner.NetNS, "http://"+target.PodIP+":8080/ready", time.Second); err != nil {
		t.Fatal(err)
	}
	took, err = eventually(15*time.Second, func() error {
		r, err := replicaOf(n1, "execready", target.Name)
		if err != nil || !r.Ready {
			return fmt.Errorf("not ready: %+v %v", r, err)
		}
		return inRules(target.PodIP, true)
	})
	if err != nil {
		t.Fatal("passing exec readiness again: ", err)
	}
	t.Logf("exec check passing again: back in every node's rules in %v", took.Round(time.Millisecond))

	for _, n := range c.Nodes {
		if mean, count := probeMean(t, c, n, "readiness", "exec"); count > 0 {
			t.Logf("%s: exec readiness probe took %v on average over %d probes", n.Name, mean.Round(time.Millisecond), count)
		}
	}

	// A command that outlives timeoutSeconds fails the probe and is
	// killed: at most the running probe's process is ever in the container.
	slowCheck := harness.ExecProbe(0, "/echo", "check", "-sleep", "30s")
	slowCheck.TimeoutSeconds = 1
	apply(t, n1, harness.App{Name: "execslow", Replicas: 1, Grace: harness.Seconds(1), Readiness: slowCheck}.Deployment())
	var slow replica
	if _, err := eventually(30*time.Second, func() (err error) {
		slow, err = replicaOf(n1, "execslow", "")
		if err == nil && (slow.Phase != api.PhaseRunning || !strings.Contains(slow.Reason, "timed out")) {
			err = fmt.Errorf("want a Running replica whose probe timed out: %+v", slow)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	slowNode := nodeOf(c, slow.Node)
	for i := 0; i < 20; i++ {
		if n, states := checkProcs(slowNode, slow.Namespace+"_"+slow.Name); n > 1 {
			t.Fatalf("%d exec probe processes at once in %s: timed-out commands are not killed: %s", n, slow.Name, states)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if r, err := replicaOf(n1, "execslow", ""); err != nil || r.Ready || r.Phase != api.PhaseRunning {
		t.Fatalf("slow-probe replica: %+v %v", r, err)
	}
	if reason, err := replicaReason(n1, slow.Name); err != nil || reason != "readiness probe failed: exec timed out after 1s" {
		t.Fatalf("slow-probe reason %q %v", reason, err)
	}
}

// TestLivenessFailureRestartsContainer: a replica whose liveness endpoint
// starts failing is stopped and restarted in place (restart count up, new
// process, same pod IP) and is ready again; failing again right away, it
// waits out the crash backoff with the probe's reason shown.
func TestLivenessFailureRestartsContainer(t *testing.T) {
	n := echoNode(t)
	apply(t, n, harness.App{Name: "live", Replicas: 1, Grace: harness.Seconds(5), Ports: harness.HTTPPort,
		Liveness: harness.HTTPProbe("/livez", 2), Readiness: harness.HTTPProbe("/healthz", 0)}.Deployment())
	var r replica
	if _, err := eventually(30*time.Second, func() (err error) {
		if r, err = replicaOf(n, "live", ""); err == nil && !r.Ready {
			err = fmt.Errorf("not ready: %+v", r)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	id := r.Namespace + "_" + r.Name
	before := taskPIDs(t, n)[id]
	sick := func() time.Time {
		if _, err := harness.HTTPGet(n.NetNS, "http://"+r.PodIP+":8080/sick", time.Second); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	t0 := sick()
	var restartedAt time.Time
	_, err := eventually(20*time.Second, func() error {
		got, err := replicaOf(n, "live", r.Name)
		if err != nil {
			return err
		}
		if got.Restarts < 1 {
			return fmt.Errorf("restarts %d phase %s", got.Restarts, got.Phase)
		}
		if restartedAt.IsZero() {
			restartedAt = time.Now()
		}
		if !got.Ready || got.Phase != api.PhaseRunning {
			return fmt.Errorf("restarted but not ready: %+v", got)
		}
		if got.Restarts != 1 || got.PodIP != r.PodIP {
			return fmt.Errorf("want 1 restart in place: %+v", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal("liveness failure did not restart the container: ", err)
	}
	after := taskPIDs(t, n)[id]
	if after == "" || after == before {
		t.Fatalf("process not replaced: %q then %q", before, after)
	}
	t.Logf("liveness failing: restarted %v and ready again %v after the endpoint broke (period 1s, failureThreshold 2)",
		restartedAt.Sub(t0).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	log := n.Tail(200)
	if !strings.Contains(log, "liveness probe failed: HTTP 500") {
		t.Fatalf("agent log does not say why it restarted:\n%s", log)
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "restarting container") || strings.Contains(line, "action=stop") || strings.Contains(line, "action=start") {
			t.Log(line)
		}
	}

	// Failing again within 10 minutes: the crash backoff (10 s) applies,
	// with the probe's reason shown meanwhile.
	sick()
	took, err := eventually(15*time.Second, func() error {
		got, err := replicaOf(n, "live", r.Name)
		if err != nil {
			return err
		}
		reason, err := replicaReason(n, r.Name)
		if err != nil {
			return err
		}
		if got.Phase != api.PhaseCrashLoopBackOff || reason != "liveness probe failed: HTTP 500" {
			return fmt.Errorf("phase %s reason %q", got.Phase, reason)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second liveness failure: CrashLoopBackOff with the probe's reason after %v", took.Round(time.Millisecond))
	took, err = eventually(20*time.Second, func() error {
		got, err := replicaOf(n, "live", r.Name)
		if err != nil || got.Restarts != 2 || !got.Ready {
			return fmt.Errorf("want ready after 2 restarts: %+v %v", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted after the backoff and ready again %v later", took.Round(time.Millisecond))
}

// TestStartupProbeHoldsReadinessUntilItPasses: while the startup probe
// fails, neither liveness (which would fail too) nor readiness runs and the
// replica is not ready; once it passes the replica becomes ready without a
// restart. A startup probe that keeps failing restarts its container.
func TestStartupProbeHoldsReadinessUntilItPasses(t *testing.T) {
	c := newCluster(t, 1)
	n := c.Nodes[0]
	importEcho(t, n)
	slowstart := harness.App{Name: "slowstart", Replicas: 1, Grace: harness.Seconds(1), Ports: harness.HTTPPort,
		Liveness:  harness.ExecProbe(1, "/echo", "check", "-exists", "/tmp/started"),
		Readiness: harness.HTTPProbe("/healthz", 0),
		Pod:       startupProbe(harness.ExecProbe(60, "/echo", "check", "-exists", "/tmp/started"))}
	neverstart := harness.App{Name: "neverstart", Replicas: 1, Grace: harness.Seconds(1),
		Pod: startupProbe(harness.ExecProbe(2, "/echo", "check", "-exists", "/tmp/never"))}
	apply(t, n, harness.Manifests(slowstart.Deployment(), neverstart.Deployment()))
	r, _ := waitRunning(t, n, "slowstart", 1, 30*time.Second)
	slow := r[0]
	// The readiness endpoint passes from the start: only the startup
	// probe holds the replica back.
	if _, err := eventually(5*time.Second, func() error {
		_, err := harness.HTTPGet(n.NetNS, "http://"+slow.PodIP+":8080/healthz", time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		time.Sleep(time.Second)
		got, err := replicaOf(n, "slowstart", slow.Name)
		if err != nil {
			t.Fatal(err)
		}
		reason, _ := replicaReason(n, slow.Name)
		if got.Ready || got.Restarts != 0 || !strings.HasPrefix(reason, "startup probe has not succeeded yet") {
			t.Fatalf("during startup: %+v reason %q", got, reason)
		}
	}
	reason, _ := replicaReason(n, slow.Name)
	t.Logf("during startup: not ready, reason %q", reason)
	if _, err := harness.HTTPGet(n.NetNS, "http://"+slow.PodIP+":8080/set?file=started", time.Second); err != nil {
		t.Fatal(err)
	}
	took, err := eventually(10*time.Second, func() error {
		got, err := replicaOf(n, "slowstart", slow.Name)
		if err != nil || !got.Ready {
			return fmt.Errorf("not ready: %+v %v", got, err)
		}
		if got.Restarts != 0 {
			return fmt.Errorf("restarted: %+v", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal("startup probe passing: ", err)
	}
	t.Logf("startup check passing: ready %v later, no restart", took.Round(time.Millisecond))

	// The other one never starts: restarted after 2 failed startup probes.
	took, err = eventually(30*time.Second, func() error {
		got, err := replicaOf(n, "neverstart", "")
		if err != nil || got.Restarts < 1 || got.Ready {
			return fmt.Errorf("want a restart: %+v %v", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal("failing startup probe: ", err)
	}
	if log := n.Tail(300); !strings.Contains(log, "startup probe failed: command exited with code 1: /tmp/never does not exist") {
		t.Fatalf("agent log does not say why it restarted:\n%s", log)
	}
	if mean, count := probeMean(t, c, n, "startup", "exec"); count > 0 {
		t.Logf("exec startup probe mean %v over %d probes", mean.Round(time.Millisecond), count)
	}
}

// startupProbe sets p as the startup probe of a pod's container.
func startupProbe(p *corev1.Probe) func(*corev1.PodSpec) {
	return func(spec *corev1.PodSpec) { spec.Containers[0].StartupProbe = p }
}

// waitReadyNodes waits until n sees want nodes alive with a settled subnet
// (eligible for placement): applying before that places everything on the
// nodes that settled first, and placement then moves replicas as the
// others become ready.
func waitReadyNodes(t *testing.T, n *harness.Node, want int) {
	t.Helper()
	if _, err := eventually(30*time.Second, func() error {
		out, err := n.CLI("get", "nodes", "-o", "json")
		if err != nil {
			return err
		}
		var l struct {
			Items []struct {
				State string
				Ready bool
			}
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			return err
		}
		ready := 0
		for _, nd := range l.Items {
			if nd.State == "alive" && nd.Ready {
				ready++
			}
		}
		if ready != want {
			return fmt.Errorf("%s sees %d ready nodes, want %d: %s", n.Name, ready, want, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
