package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// TestAClaimKeepsItsDataOnItsNode: a Deployment (strategy Recreate, one
// replica) mounts a standalone PersistentVolumeClaim. Its data stays on
// the node that first ran it, through a rollout (the old copy stops
// before the new starts, on the same node; never two copies, sampled
// every 0.2 s), an agent kill and an agent restart. Cut off, the node
// keeps the replica: it waits Pending naming the node, and no other
// node runs it; back, the node runs it again with its data. Cut off
// again and released (volume release), the replica starts empty on
// another node, and the node, back, deletes the data given up. Deleted
// while its replica runs, the claim is Terminating until the Deployment
// goes, then deleted with its data. A rolling Deployment on a claim is
// refused naming Recreate.
func TestAClaimKeepsItsDataOnItsNode(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	n1 := c.Nodes[0]
	for _, n := range c.Nodes { // the replica moves off a node cut off: the image must not live there alone
		importEcho(t, n)
	}
	waitReadyNodes(t, n1, 3)
	const ns = "pvcdata"
	apply(t, n1, "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: notes, namespace: "+ns+"}\n"+
		"spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}\n")
	app := echoApp("notes", 1, "")
	app.Namespace = ns
	mount := func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "notes"}}}}
		d.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	}
	// Rolling (the default): refused, naming Recreate.
	out, err := n1.CLIInput(strings.NewReader(app.Deployment(mount)), "apply", "-f", "-")
	if err == nil || !strings.Contains(out+err.Error(), "Recreate") {
		t.Fatalf("a rolling Deployment on a claim: %v %s", err, out)
	}
	apply(t, n1, app.Deployment(mount, func(d *appsv1.Deployment) { d.Spec.Strategy.Type = appsv1.RecreateDeploymentStrategyType }))
	reps, took := waitRunning(t, n1, "notes", 1, 90*time.Second)
	home := nodeNamed(c, reps[0].Node)
	t.Logf("the replica runs on %s, %v after the apply", home.Name, took.Round(100*time.Millisecond))
	write := func(r replica, text string) {
		t.Helper()
		if body, err := nodeNamed(c, r.Node).ReplicaHTTPPost(ns, r.Name, "http://"+r.PodIP+":8080/file?path=/data/note", text, 5*time.Second); err != nil {
			t.Fatalf("write to the claim: %v %s", err, body)
		}
	}
	read := func(r replica) string {
		t.Helper()
		body, err := nodeNamed(c, r.Node).ReplicaHTTPGet(ns, r.Name, "http://"+r.PodIP+":8080/file?path=/data/note", 5*time.Second)
		if err != nil {
			return "(no file: " + strings.TrimSpace(body) + ")"
		}
		return body
	}
	write(reps[0], "kept-1")
	out, err = n1.CLI("get", "pvc", "-n", ns)
	if err != nil || !strings.Contains(out, "Bound") || !strings.Contains(out, home.Name) || !strings.Contains(out, "64Mi") {
		t.Fatalf("get pvc: %v\n%s", err, out)
	}
	t.Logf("get pvc:\n%s", out)
	if out, err := n1.CLI("describe", "pvc", "notes", "-n", ns); err != nil || !strings.Contains(out, reps[0].Name) || !strings.Contains(out, "advisory") {
		t.Fatalf("describe pvc: %v\n%s", err, out)
	}

	// Copies of the replica on all nodes, sampled every 0.2 s.
	var mu sync.Mutex
	most, whereMost := 0, ""
	stop := every(200*time.Millisecond, func() {
		n, where := 0, map[string]int{}
		for _, nd := range c.Nodes {
			for id := range nd.TaskPIDs() {
				if strings.HasPrefix(id, ns+"_notes-") {
					n++
					where[nd.Name]++
				}
			}
		}
		mu.Lock()
		if n > most {
			most, whereMost = n, fmt.Sprint(where)
		}
		mu.Unlock()
	})
	defer stop()

	// A rollout: Recreate, same node, same data.
	if _, err := n1.CLI("rollout", "restart", "deployment", "notes", "-n", ns); err != nil {
		t.Fatal(err)
	}
	reps[0] = waitReplaced(t, n1, "notes", reps[0].Name)
	if reps[0].Node != home.Name || read(reps[0]) != "kept-1" {
		t.Fatalf("after the rollout: on %s reading %q, want %s and kept-1", reps[0].Node, read(reps[0]), home.Name)
	}

	// The agent killed and restarted: the replica and its data stay.
	home.KillAgent(syscall.SIGKILL)
	if err := home.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	reps, _ = waitRunning(t, n1, "notes", 1, 60*time.Second)
	if reps[0].Node != home.Name || read(reps[0]) != "kept-1" {
		t.Fatalf("after an agent restart: on %s reading %q", reps[0].Node, read(reps[0]))
	}
	write(reps[0], "kept-2")

	// Cut off: Pending naming the node, never started elsewhere.
	other := c.Nodes[0]
	if other == home {
		other = c.Nodes[1]
	}
	cutOffPending(t, home, other, "notes", 0)
	time.Sleep(15 * time.Second) // past --failover-timeout: still nowhere
	for _, nd := range c.Nodes {
		if nd == home {
			continue
		}
		for id := range nd.TaskPIDs() {
			if strings.HasPrefix(id, ns+"_notes-") {
				t.Fatalf("%s runs %s while the node that holds its data is cut off", nd.Name, id)
			}
		}
	}
	if err := home.Reconnect(); err != nil {
		t.Fatal(err)
	}
	reps, took = waitRunning(t, other, "notes", 1, 90*time.Second)
	if reps[0].Node != home.Name || read(reps[0]) != "kept-2" {
		t.Fatalf("back: on %s reading %q, want %s and kept-2", reps[0].Node, read(reps[0]), home.Name)
	}
	t.Logf("the node back, the replica ran again with its data %v later", took.Round(100*time.Millisecond))
	stop()
	if most > 1 {
		t.Errorf("up to %d copies ran at once (%s): a claim's replica must never run twice", most, whereMost)
	}

	// Released while the node is up: refused. Cut off and released: the
	// replica starts empty elsewhere; the node, back, deletes the data.
	if out, err := other.CLI("volume", "release", ns+"/notes"); err == nil || !strings.Contains(out+err.Error(), "is up") {
		t.Fatalf("release while the node is up: %v %s", err, out)
	}
	volDir := filepath.Join(home.DataDir, "volumes")
	entries, _ := os.ReadDir(volDir)
	if len(entries) != 1 {
		t.Fatalf("%s holds %d volumes, want 1", volDir, len(entries))
	}
	if err := home.CutOff(); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, 30*time.Second, []*harness.Node{other}, home.Name, "dead", "")
	// Refused while the node is suspect (it may be up); given once dead.
	waitFor(t, 20*time.Second, func() error {
		out, err := other.CLI("volume", "release", ns+"/notes")
		if err != nil || !strings.Contains(out, "released from node "+home.Name) {
			return fmt.Errorf("volume release: %v %s", err, out)
		}
		return nil
	})
	reps, took = waitRunning(t, other, "notes", 1, 60*time.Second)
	if reps[0].Node == home.Name || !strings.HasPrefix(read(reps[0]), "(no file") {
		t.Fatalf("released: on %s reading %q, want another node and no file", reps[0].Node, read(reps[0]))
	}
	t.Logf("released: the replica ran empty on %s %v later", reps[0].Node, took.Round(100*time.Millisecond))
	if err := home.Reconnect(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, func() error {
		if _, err := os.Stat(filepath.Join(volDir, entries[0].Name())); err == nil {
			return fmt.Errorf("%s still holds the released volume %s", home.Name, entries[0].Name())
		}
		return nil
	})

	// Deleted while its replica runs: Terminating (Kubernetes' protection
	// finalizer) until the Deployment goes, then deleted with its data.
	if out, err := n1.CLI("delete", "pvc", "notes", "-n", ns); err != nil || !strings.Contains(out, "in use by "+reps[0].Name) {
		t.Fatalf("delete pvc in use: %v %s", err, out)
	}
	if out, err := n1.CLI("get", "pvc", "notes", "-n", ns); err != nil || !strings.Contains(out, "Terminating") {
		t.Fatalf("get pvc after its delete was asked: %v\n%s", err, out)
	}
	if _, err := n1.CLI("delete", "deployment", "notes", "-n", ns); err != nil {
		t.Fatal(err)
	}
	newHome := nodeNamed(c, reps[0].Node)
	waitFor(t, 60*time.Second, func() error {
		out, _ := n1.CLI("get", "pvc", "-n", ns)
		left, _ := os.ReadDir(filepath.Join(newHome.DataDir, "volumes"))
		if strings.Contains(out, "notes") || len(left) != 0 {
			return fmt.Errorf("the claim or its data is left: %s; %d volumes on %s", out, len(left), newHome.Name)
		}
		return nil
	})
}

// waitReplaced waits for a running replica of workload other than old
// (a rollout's new copy), as n sees it.
func waitReplaced(t *testing.T, n *harness.Node, workload, old string) replica {
	t.Helper()
	var found replica
	waitFor(t, 90*time.Second, func() error {
		all, err := replicas(n)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Workload == workload && r.Name != old && r.Phase == api.PhaseRunning {
				found = r
				return nil
			}
		}
		return fmt.Errorf("no new replica of %s runs: %+v", workload, all)
	})
	return found
}

// cutOffPending cuts home off and waits until watcher holds it dead and
// shows ordinal of workload Pending on no node, its reason naming home
// (the node that holds its volume).
func cutOffPending(t *testing.T, home, watcher *harness.Node, workload string, ordinal int) {
	t.Helper()
	if err := home.CutOff(); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, 30*time.Second, []*harness.Node{watcher}, home.Name, "dead", "")
	waitFor(t, 30*time.Second, func() error {
		all, err := replicas(watcher)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Workload == workload && r.Ordinal == ordinal && r.Phase == api.PhasePending && r.Node == "" && strings.Contains(r.Reason, "node "+home.Name) {
				return nil
			}
		}
		return fmt.Errorf("%s's ordinal %d is not Pending naming %s: %+v", workload, ordinal, home.Name, all)
	})
}

// nodeNamed is the node of c named name (nil: none).
func nodeNamed(c *harness.Cluster, name string) *harness.Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// TestAStatefulSetKeepsEachOrdinalsData is the shape of a PostgreSQL
// StatefulSet: a password from a Secret through secretKeyRef, a
// ConfigMap mounted as a file, its memory and CPU through
// resourceFieldRef, and a volumeClaimTemplate. Each ordinal
// gets its own claim on the node that first ran it and finds its data
// again after a rollout, an agent kill -9, a containerd restart and a
// reboot of its node (everything stopped, the agent started again). Its
// node cut off, ordinal 0 waits Pending naming the node and never runs
// elsewhere; back, it runs again with its data. Deleting the
// StatefulSet keeps the claims (the default Retain).
func TestAStatefulSetKeepsEachOrdinalsData(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 3)
	n1 := c.Nodes[0]
	for _, n := range c.Nodes {
		importEcho(t, n)
	}
	waitReadyNodes(t, n1, 3)
	const ns = "pgshape"
	apply(t, n1, "apiVersion: v1\nkind: Secret\nmetadata: {name: pg-auth, namespace: "+ns+"}\nstringData: {password: pg-pass-31}\n---\n"+
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: pg-conf, namespace: "+ns+"}\ndata: {postgresql.conf: \"max_connections = 20\"}\n")
	app := echoApp("pg", 2, "")
	app.Namespace = ns
	shape := func(s *appsv1.StatefulSet) {
		pod := &s.Spec.Template.Spec
		pod.Containers[0].Env = []corev1.EnvVar{{Name: "MESSAGE", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "pg-auth"}, Key: "password"}}},
			// As charts size a database's memory and workers.
			{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
			{Name: "CPU_MILLI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "requests.cpu", Divisor: resource.MustParse("1m")}}}}
		pod.Volumes = []corev1.Volume{{Name: "conf", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "pg-conf"}}}}}
		pod.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "conf", MountPath: "/etc/pg"}, {Name: "data", MountPath: "/var/lib/pg"}}
		s.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")}}}}}
	}
	apply(t, n1, app.StatefulSet("pg", shape))
	reps, took := waitRunning(t, n1, "pg", 2, 120*time.Second)
	t.Logf("both ordinals run %v after the apply", took.Round(100*time.Millisecond))
	get := func(r replica, path string) string {
		t.Helper()
		body, err := nodeNamed(c, r.Node).ReplicaHTTPGet(ns, r.Name, "http://"+r.PodIP+":8080"+path, 5*time.Second)
		if err != nil {
			return "(error: " + strings.TrimSpace(body) + ")"
		}
		return body
	}
	homes := map[int]string{}
	for _, r := range reps {
		homes[r.Ordinal] = r.Node
		if _, err := nodeNamed(c, r.Node).ReplicaHTTPPost(ns, r.Name, fmt.Sprintf("http://%s:8080/file?path=/var/lib/pg/PG_VERSION", r.PodIP), fmt.Sprintf("ordinal-%d", r.Ordinal), 5*time.Second); err != nil {
			t.Fatalf("write ordinal %d's data: %v", r.Ordinal, err)
		}
		if got := get(r, "/"); !strings.Contains(got, "message=pg-pass-31") {
			t.Errorf("ordinal %d's password from the Secret: %q", r.Ordinal, got)
		}
		if got := get(r, "/file?path=/etc/pg/postgresql.conf"); got != "max_connections = 20" {
			t.Errorf("ordinal %d's config file: %q", r.Ordinal, got)
		}
		// The limits echoApp sets (48Mi, 250m; the request is the limit).
		if env := strings.Split(get(r, "/file?path=/proc/self/environ"), "\x00"); !slices.Contains(env, "MEM_MI=48") || !slices.Contains(env, "CPU_MILLI=250") {
			t.Errorf("ordinal %d's resourceFieldRef variables: %q", r.Ordinal, env)
		}
	}
	out, err := n1.CLI("get", "pvc", "-n", ns)
	if err != nil || !strings.Contains(out, "data-pg-0") || !strings.Contains(out, "data-pg-1") || strings.Count(out, "Bound") != 2 {
		t.Fatalf("get pvc: %v\n%s", err, out)
	}
	t.Logf("get pvc:\n%s", out)
	// check waits until both ordinals run and answer with their data
	// (a record from before a restart can still say Running for a
	// moment); a copy on another node than its data's fails at once.
	check := func(when string) {
		t.Helper()
		waitFor(t, 120*time.Second, func() error {
			rs, err := replicas(n1)
			if err != nil {
				return err
			}
			running := 0
			for _, r := range rs {
				if r.Workload != "pg" || r.Phase != api.PhaseRunning {
					continue
				}
				if r.Node != homes[r.Ordinal] {
					t.Fatalf("%s: ordinal %d runs on %s, its data is on %s", when, r.Ordinal, r.Node, homes[r.Ordinal])
				}
				if got := get(r, "/file?path=/var/lib/pg/PG_VERSION"); got != fmt.Sprintf("ordinal-%d", r.Ordinal) {
					return fmt.Errorf("ordinal %d reads %q", r.Ordinal, got)
				}
				running++
			}
			if running != 2 {
				return fmt.Errorf("%d of 2 ordinals run: %+v", running, rs)
			}
			return nil
		})
		t.Logf("%s: each ordinal runs on its node with its data", when)
	}
	// A rollout (kubectl's restart annotation, applied).
	apply(t, n1, app.StatefulSet("pg", shape, func(s *appsv1.StatefulSet) {
		s.Spec.Template.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-12-06T00:00:00Z"}
	}))
	waitFor(t, 120*time.Second, func() error {
		rs, err := replicas(n1)
		if err != nil {
			return err
		}
		restarted := 0
		for _, r := range rs {
			if r.Workload == "pg" && r.Phase == api.PhaseRunning && r.SpecHash != reps[0].SpecHash {
				restarted++
			}
		}
		if restarted != 2 {
			return fmt.Errorf("%d of 2 ordinals rolled", restarted)
		}
		return nil
	})
	check("after a rollout")
	home0 := nodeNamed(c, homes[0])
	home0.KillAgent(syscall.SIGKILL)
	if err := home0.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	check("after an agent kill -9")
	home0.StopContainerd()
	if err := home0.StartContainerd(); err != nil {
		t.Fatal(err)
	}
	check("after a containerd restart")
	if err := home0.Reboot(); err != nil {
		t.Fatal(err)
	}
	check("after a reboot")

	// Ordinal 0's node cut off: Pending naming it, never elsewhere.
	watcher := n1
	if watcher == home0 {
		watcher = c.Nodes[1]
	}
	cutOffPending(t, home0, watcher, "pg", 0)
	time.Sleep(15 * time.Second)
	for _, nd := range c.Nodes {
		if _, ok := nd.TaskPIDs()[ns+"_pg-0"]; ok && nd != home0 {
			t.Fatalf("%s runs ordinal 0 while its data's node is cut off", nd.Name)
		}
	}
	if err := home0.Reconnect(); err != nil {
		t.Fatal(err)
	}
	check("back from the cut")

	// Deleting the StatefulSet keeps its claims (Retain).
	if _, err := n1.CLI("delete", "statefulset", "pg", "-n", ns); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if out, err := n1.CLI("get", "pvc", "-n", ns); err != nil || strings.Count(out, "Bound") != 2 {
		t.Fatalf("after the StatefulSet's delete: %v\n%s", err, out)
	}
}

// TestAReadWriteOncePodClaimHasOneUser: two replicas mount one
// ReadWriteOncePod claim; one runs, the other stays Pending with a
// REASON that names the claim and its user, and does not start.
func TestAReadWriteOncePodClaimHasOneUser(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	n1 := c.Nodes[0]
	importEcho(t, n1)
	const ns = "pvconce"
	apply(t, n1, "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: solo, namespace: "+ns+"}\n"+
		"spec: {accessModes: [ReadWriteOncePod], resources: {requests: {storage: 16Mi}}}\n")
	app := echoApp("solo", 2, "")
	app.Namespace = ns
	apply(t, n1, app.Deployment(func(d *appsv1.Deployment) {
		d.Spec.Strategy.Type = appsv1.RecreateDeploymentStrategyType
		d.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "solo"}}}}
		d.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	}))
	var phases []string
	if _, err := eventually(60*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		running, waiting := 0, 0
		phases = nil
		for _, r := range all {
			if r.Namespace != ns {
				continue
			}
			phases = append(phases, string(r.Phase)+" "+r.Reason)
			switch {
			case r.Phase == api.PhaseRunning:
				running++
			case r.Phase == api.PhasePending && strings.Contains(r.Reason, `persistentvolumeclaim "solo" is ReadWriteOncePod and replica solo-`):
				waiting++
			}
		}
		if running != 1 || waiting != 1 {
			return fmt.Errorf("%d running, %d waiting for the claim: %q", running, waiting, phases)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Held for 3 s more: the second never starts beside the first.
	time.Sleep(3 * time.Second)
	all, err := replicas(n1)
	if err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, r := range all {
		if r.Namespace == ns && r.Phase == api.PhaseRunning {
			running++
		}
	}
	if running != 1 {
		t.Fatalf("%d replicas run on a ReadWriteOncePod claim, want 1", running)
	}
}
