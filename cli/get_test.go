package cli

import (
	appsv1 "k8s.io/api/apps/v1"

	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
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
	objs, err := manifest.Parse([]byte(`apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 6
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, image: "img:v2"}]
`), "test")
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
