package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/test/harness"
)

// TestGetNodesShowsInsecureNodes: a node running with --insecure says so
// in its STATE column.
func TestGetNodesShowsInsecureNodes(t *testing.T) {
	var b strings.Builder
	err := printNodes(&b, getOpts{}, []api.Node{{Name: "n1", State: "alive"}, {Name: "n2", State: "alive", Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if !strings.Contains(lines[1], "alive ") || strings.Contains(lines[1], "insecure") || !strings.Contains(lines[2], "alive,insecure") {
		t.Fatalf("get nodes:\n%s", b.String())
	}
}

// AGE is the replica's (its container's) age, as kubectl's is the pod's,
// not the current run's; a node that does not report creation times
// falls back to the run's start.
func TestReplicaAgeCountsFromCreation(t *testing.T) {
	now := time.Now()
	r := api.Replica{Name: "web-1", Created: now.Add(-3 * time.Hour), Started: now.Add(-10 * time.Second), Restarts: 4, Phase: api.PhaseRunning}
	if got := age(replicaCreated(r)); got != "3h" {
		t.Errorf("AGE of a replica created 3h ago that restarted 10s ago: %q, want 3h", got)
	}
	r.Created = time.Time{}
	if got := age(replicaCreated(r)); got != "10s" {
		t.Errorf("AGE without a creation time: %q, want the run's 10s", got)
	}
}

// image import's progress line counts what was sent of the file.
func TestUploadProgressRedrawsOneLine(t *testing.T) {
	var out strings.Builder
	p := &uploadProgress{r: strings.NewReader(strings.Repeat("x", 4_000_000)), w: &out, name: "big.tar", total: 4_000_000}
	buf := make([]byte, 1_000_000)
	for {
		if _, err := p.Read(buf); err != nil {
			break
		}
	}
	p.Finish()
	got := out.String()
	if !strings.Contains(got, "\rimporting big.tar: 1.0 MB of 4.0 MB (25%)") || !strings.HasSuffix(got, "\rimporting big.tar: 4.0 MB of 4.0 MB (100%)\x1b[K\n") {
		t.Fatalf("progress output %q", got)
	}
}

// get deployments counts as Kubernetes does (DeploymentStatus over every
// copy): during a rollout whose new copy is not ready, the old copies that
// serve are READY and AVAILABLE, only the new one is UP-TO-DATE, and the
// conditions say the Deployment is available and progressing, then, past
// its progress deadline, that it timed out (issue 13: it printed READY 6/6
// UP-TO-DATE 6 AVAILABLE 0, and -o json had no status).
func TestDeploymentStatusDuringAStalledRollout(t *testing.T) {
	web := harness.App{Name: "web", Replicas: 6, Container: "c", Image: "img:v2"}
	objs, err := manifest.Parse([]byte(web.Deployment()), "test")
	if err != nil {
		t.Fatal(err)
	}
	d := objs[0].Deployment
	var reps []api.Replica
	for i := range 6 {
		reps = append(reps, api.Replica{Namespace: "default", Workload: "web", Ordinal: i, SpecHash: "0ld0ld00", Phase: api.PhaseRunning, Ready: true})
	}
	reps = append(reps, api.Replica{Namespace: "default", Workload: "web", Ordinal: 0, SpecHash: manifest.SpecHash(d), Phase: api.PhaseRunning, Created: time.Now()})
	// The other ordinals' new copies wait for the rollout gate: listed
	// Pending, but Kubernetes would not have created them.
	for i := 1; i < 6; i++ {
		reps = append(reps, api.Replica{Namespace: "default", Workload: "web", Ordinal: i, SpecHash: manifest.SpecHash(d), Phase: api.PhasePending})
	}
	st := deploymentStatus(d, reps)
	if st.Replicas != 7 || st.ReadyReplicas != 6 || st.UpdatedReplicas != 1 || st.AvailableReplicas != 6 || st.UnavailableReplicas != 1 {
		t.Fatalf("status %+v, want replicas 7, ready 6, updated 1, available 6, unavailable 1", st)
	}
	cond := func(st appsv1.DeploymentStatus, typ appsv1.DeploymentConditionType) string {
		for _, c := range st.Conditions {
			if c.Type == typ {
				return string(c.Status) + " " + c.Reason
			}
		}
		return ""
	}
	if got := cond(st, appsv1.DeploymentAvailable); got != "True MinimumReplicasAvailable" {
		t.Errorf("Available: %q", got)
	}
	if got := cond(st, appsv1.DeploymentProgressing); got != "True ReplicaSetUpdated" {
		t.Errorf("Progressing: %q", got)
	}
	var out strings.Builder
	if err := printDeployments(&out, getOpts{}, objs, reps); err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(strings.Split(out.String(), "\n")[1]); len(f) < 4 || f[1] != "6/6" || f[2] != "1" || f[3] != "6" {
		t.Errorf("get deployments:\n%s", out.String())
	}
	out.Reset()
	if err := printDeployments(&out, getOpts{output: "json"}, objs, reps); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"updatedReplicas": 1`, `"readyReplicas": 6`, `"reason": "ReplicaSetUpdated"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-o json lacks %s:\n%s", want, out.String())
		}
	}
	// Past the progress deadline (600 s by default) with no progress.
	reps[6].Created = time.Now().Add(-11 * time.Minute)
	d.CreationTimestamp.Time = time.Now().Add(-time.Hour)
	if got := cond(deploymentStatus(d, reps), appsv1.DeploymentProgressing); got != "False ProgressDeadlineExceeded" {
		t.Errorf("Progressing after the deadline: %q", got)
	}
	// Three old copies stopped serving: below 6 - maxUnavailable (25%: 1).
	for i := range 3 {
		reps[i].Ready = false
	}
	if got := cond(deploymentStatus(d, reps), appsv1.DeploymentAvailable); got != "False MinimumReplicasUnavailable" {
		t.Errorf("Available with 3 of 6: %q", got)
	}
}

// get replicas -o wide shows a replica's whole reason: cut at 80 bytes it
// hid the hint that says what to do (issue 39).
func TestWideReplicasShowTheWholeReason(t *testing.T) {
	why := "image starling.local/missing:v1 is not on this node and could not be fetched (peers: no node imported starling.local/missing:v1 into the cluster; registry: no such host): import it on any node with 'starling image import FILE.tar' (an OCI or 'docker save' tarball)"
	var b strings.Builder
	if err := printReplicas(&b, getOpts{output: "wide"}, []api.Replica{{Name: "web-0", Phase: api.PhaseCreateBackOff, Reason: why}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), why) {
		t.Fatalf("get replicas -o wide:\n%s", b.String())
	}
}

// get nodes' AGE counts from the node's first join (its member-since),
// not from its agent's last restart (issue 39: it reset on every restart).
func TestNodeAgeCountsFromFirstJoin(t *testing.T) {
	now := time.Now()
	var b strings.Builder
	if err := printNodes(&b, getOpts{}, []api.Node{{Name: "n1", State: "alive", Joined: now.Add(-49 * time.Hour), Started: now.Add(-5 * time.Second)}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), " 2d") {
		t.Fatalf("get nodes of a node that joined 2 days ago and restarted 5s ago:\n%s", b.String())
	}
}

// The hint about a missing agent is the CLI's: the client's error (also
// what one node logs when it cannot reach another) does not carry it.
func TestAgentHintOnlyInTheCLI(t *testing.T) {
	te := &client.TransportError{Base: "https://192.0.2.1:7443", Err: errors.New("connection refused")}
	if strings.Contains(te.Error(), "starling agent") {
		t.Fatalf("the client's error carries the CLI hint: %v", te)
	}
	if got := withHint(fmt.Errorf("get nodes: %w", te)).Error(); !strings.Contains(got, "is 'starling agent' running?") || !strings.Contains(got, "192.0.2.1") {
		t.Fatalf("the CLI's error: %s", got)
	}
	if got := withHint(&client.TransportError{Err: errors.New("x"), Pin: true}).Error(); strings.Contains(got, "starling agent") {
		t.Fatalf("a pin mismatch got the hint: %s", got)
	}
}
