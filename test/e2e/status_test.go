package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/test/harness"
)

// stalledDeployment is a Deployment of 4 replicas that rolls one at a
// time and never below 4 ready (maxSurge 1, maxUnavailable 0).
func stalledDeployment(image string) string {
	return harness.App{Name: "stall", Replicas: 4, Image: image, Grace: harness.Seconds(1), Ports: harness.Port8080}.Deployment(
		func(d *appsv1.Deployment) {
			surge, unavailable := intstr.FromInt32(1), intstr.FromInt32(0)
			d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxSurge: &surge, MaxUnavailable: &unavailable}
		})
}

// Status during a rollout whose new version never starts: get
// deployments used to print READY 6/6 UP-TO-DATE 6 AVAILABLE 0 while the
// old replicas served and one new replica existed, -o json had no
// status, and the new replica showed ContainerCreating with an empty
// REASON in most polls. Now the figures are Kubernetes' (readyReplicas,
// updatedReplicas, availableReplicas over every copy, with the Available
// and Progressing conditions), -o json carries them, and the reason
// shows in every poll. An object over the size limit is named by its
// kind and name.
func TestStalledRolloutShowsKubernetesStatusAndTheReasonEveryTime(t *testing.T) {
	t.Parallel() // long and mostly waiting: runs beside another such test
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	importEcho(t, n1)
	apply(t, n1, stalledDeployment("starling.local/echo:v1"))
	waitFor(t, 60*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		ready := 0
		for _, r := range all {
			if r.Workload == "stall" && r.Ready {
				ready++
			}
		}
		if ready != 4 {
			return fmt.Errorf("%d of 4 replicas ready", ready)
		}
		return nil
	})
	apply(t, n1, stalledDeployment("starling.local/missing:v2"))

	type condition struct{ Type, Status, Reason string }
	var status struct {
		Replicas, UpdatedReplicas, ReadyReplicas, AvailableReplicas, UnavailableReplicas int
		Conditions                                                                       []condition
	}
	waitFor(t, 60*time.Second, func() error {
		out, err := n2.CLI("get", "deployments", "stall", "-o", "json")
		if err != nil {
			return err
		}
		// One object, or a List of one (as kubectl prints either).
		type item struct {
			Status json.RawMessage `json:"status"`
		}
		var l struct {
			item
			Items []item `json:"items"`
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			return err
		}
		if len(l.Items) == 1 {
			l.item = l.Items[0]
		}
		if l.Status == nil {
			return fmt.Errorf("get deployments stall -o json has no status:\n%s", out)
		}
		if err := json.Unmarshal(l.Status, &status); err != nil {
			return err
		}
		if status.Replicas != 5 || status.UpdatedReplicas != 1 || status.ReadyReplicas != 4 || status.AvailableReplicas != 4 || status.UnavailableReplicas != 1 {
			reps, _ := n2.CLI("get", "replicas", "-o", "wide")
			return fmt.Errorf("status %+v, want replicas 5 (4 old and 1 new), updated 1, ready 4, available 4, unavailable 1; replicas:\n%s", status, reps)
		}
		return nil
	})
	want := map[string]condition{
		"Available":   {"Available", "True", "MinimumReplicasAvailable"},
		"Progressing": {"Progressing", "True", "ReplicaSetUpdated"},
	}
	for _, c := range status.Conditions {
		if w, ok := want[c.Type]; ok && c != w {
			t.Errorf("condition %+v, want %+v", c, w)
		}
		delete(want, c.Type)
	}
	if len(want) > 0 {
		t.Errorf("conditions %+v lack %v", status.Conditions, want)
	}
	// The table, through the other node (its view may lag n2's for a
	// moment: a peer's record in flight).
	waitFor(t, 15*time.Second, func() error {
		out, err := n1.CLI("get", "deployments", "stall")
		if err != nil {
			return err
		}
		if f := strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[1]); f[1] != "4/4" || f[2] != "1" || f[3] != "4" {
			return fmt.Errorf("get deployments: READY UP-TO-DATE AVAILABLE = %v, want 4/4 1 4:\n%s", f[1:4], out)
		}
		return nil
	})

	// The new replica's reason (its image is nowhere), from its first
	// failure on, in every poll for 5 s; the copies the rolling update
	// has not reached say so.
	var failing string
	waitFor(t, 30*time.Second, func() error {
		all, err := replicas(n2)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Workload == "stall" && strings.Contains(r.Reason, "missing:v2") {
				failing = r.Name
				return nil
			}
		}
		return fmt.Errorf("the new replica has not failed yet")
	})
	polls := 0
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		all, err := replicas(n2)
		if err != nil {
			t.Fatal(err)
		}
		polls++
		listed := false
		for _, r := range all {
			switch {
			case r.Name == failing:
				listed = true
				if !strings.Contains(r.Reason, "missing:v2") {
					t.Fatalf("poll %d: %s is %s with reason %q, want its image's failure", polls, r.Name, r.Phase, r.Reason)
				}
			case r.Workload == "stall" && !r.Ready && r.Reason == "":
				t.Fatalf("poll %d: %s is %s with no reason", polls, r.Name, r.Phase)
			}
		}
		if !listed {
			t.Fatalf("poll %d: %s not listed", polls, failing)
		}
	}

	// An object over the size limit is named by its kind and name.
	var env strings.Builder
	for i := range 9 {
		fmt.Fprintf(&env, "        - {name: V%d, value: %q}\n", i, strings.Repeat("x", 120<<10))
	}
	huge := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: huge}
spec:
  replicas: 1
  selector: {matchLabels: {app: huge}}
  template:
    metadata: {labels: {app: huge}}
    spec:
      containers:
      - name: echo
        image: starling.local/echo:v1
        env:
%s`, env.String())
	_, err := n1.CLIInput(strings.NewReader(huge), "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), "Deployment default/huge") || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("apply of a 1.1 MiB Deployment: %v, want an error naming Deployment default/huge and the limit", err)
	}
}
