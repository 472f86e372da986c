package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// TestAPodOfSeveralContainers: a replica with an init container, a
// native sidecar and two app containers, as the kubelet runs a pod. The
// init container writes a file to an emptyDir that the app serves; the
// sidecar starts before the app and checks it on localhost (its
// readiness probe, run in the sidecar); the second app container shares
// the pod's address; READY counts 3/3; logs -c and --all-containers
// print each container's output. A failing init container holds the
// app back in Init:CrashLoopBackOff, restarted with backoff, with a
// REASON naming it. With shareProcessNamespace every container sees the
// replica's holder as PID 1. The replica's removal takes every
// container, and the holder.
func TestAPodOfSeveralContainers(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	n1 := c.Nodes[0]
	importEcho(t, n1)
	const ns = "multipod"
	echo := func(name, port string, args ...string) corev1.Container {
		return corev1.Container{Name: name, Image: harness.EchoImage, Args: args, Env: harness.Env("PORT", port)}
	}
	always := corev1.ContainerRestartPolicyAlways
	app := echoApp("pod-web", 1, "")
	app.Namespace = ns
	apply(t, n1, app.Deployment(func(d *appsv1.Deployment) {
		spec := &d.Spec.Template.Spec
		spec.Volumes = []corev1.Volume{{Name: "www", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		fill := echo("fill", "0", "check", "-write", "/www/index=hello from init")
		fill.VolumeMounts = []corev1.VolumeMount{{Name: "www", MountPath: "/www"}}
		proxy := echo("proxy", "9090")
		proxy.RestartPolicy = &always
		proxy.ReadinessProbe = harness.ExecProbe(0, "/echo", "check", "-get", "http://localhost:8080/healthz")
		spec.InitContainers = []corev1.Container{fill, proxy}
		spec.Containers[0].Name = "web"
		spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "www", MountPath: "/www", ReadOnly: true}}
		spec.Containers = append(spec.Containers, echo("tail", "9091"))
	}))
	web, took, err := waitReplica(n1, ns, "pod-web", 90*time.Second, func(r api.Replica) bool { return r.Available() && len(r.Containers) == 4 })
	if err != nil {
		t.Fatalf("%v\n%s", err, n1.Tail(40))
	}
	t.Logf("4 containers, ready %v after the apply", took.Round(time.Millisecond))
	states := map[string]string{}
	for _, cs := range web.Containers {
		states[cs.Name] = fmt.Sprintf("%s/%s/ready=%v/init=%v", cs.State, cs.Reason, cs.Ready, cs.Init)
	}
	for name, want := range map[string]string{
		"fill": "Terminated/Completed/ready=false/init=true", "proxy": "Running//ready=true/init=true",
		"web": "Running//ready=true/init=false", "tail": "Running//ready=true/init=false",
	} {
		if states[name] != want {
			t.Errorf("container %s: %s, want %s", name, states[name], want)
		}
	}
	if out, err := n1.CLI("get", "replicas", "-n", ns); err != nil || !strings.Contains(out, " 3/3 ") {
		t.Errorf("get replicas: READY is not 3/3 (web, tail and the sidecar):\n%s %v", out, err)
	}
	// The init container's file, served by the app; the sidecar and the
	// second app container answer on the pod's one address.
	if body, err := n1.ReplicaHTTPGet(ns, web.Name, "http://"+web.PodIP+":8080/file?path=/www/index", 5*time.Second); err != nil || body != "hello from init" {
		t.Errorf("the app serves %q (%v), want the init container's file", body, err)
	}
	for _, port := range []string{"9090", "9091"} { // (a server may still be starting)
		if _, err := eventually(10*time.Second, func() error {
			_, err := n1.ReplicaHTTPGet(ns, web.Name, "http://"+web.PodIP+":"+port+"/healthz", 5*time.Second)
			return err
		}); err != nil {
			t.Errorf("port %s of the pod: %v", port, err)
		}
	}
	if out, err := n1.CLI("logs", "-n", ns, web.Name, "-c", "fill"); err != nil || !strings.Contains(out, "wrote /www/index") {
		t.Errorf("logs -c fill: %q %v", out, err)
	}
	if out, err := n1.CLI("logs", "-n", ns, web.Name, "-c", "nosuch"); err == nil {
		t.Errorf("logs -c of a container the replica does not have: %q, want an error", out)
	}
	out, err := n1.CLI("logs", "-n", ns, web.Name, "--all-containers")
	if err != nil || !strings.Contains(out, "wrote /www/index") || strings.Count(out, "listening") < 3 {
		t.Errorf("logs --all-containers: want the init container's line and three servers':\n%s %v", out, err)
	}

	// shareProcessNamespace: both containers see PID 1 of the replica's
	// namespace, its holder, and each other's processes.
	pids := echoApp("pod-pids", 1, "")
	pids.Namespace = ns
	apply(t, n1, pids.Deployment(func(d *appsv1.Deployment) {
		spec := &d.Spec.Template.Spec
		spec.ShareProcessNamespace = ptrTo(true)
		spec.Containers = append(spec.Containers, echo("tail", "9091"))
	}))
	// Both containers running: their servers may still be starting.
	shared, _, err := waitReplica(n1, ns, "pod-pids", 60*time.Second, func(r api.Replica) bool { return r.Available() && len(r.Containers) == 2 })
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range []string{"8080", "9091"} {
		var body string
		if _, err := eventually(10*time.Second, func() (err error) {
			body, err = n1.ReplicaHTTPGet(ns, shared.Name, "http://"+shared.PodIP+":"+port+"/file?path=/proc/1/cmdline", 5*time.Second)
			return err
		}); err != nil || !strings.Contains(body, "pid-holder") {
			t.Errorf("PID 1 seen from the container on port %s: %q %v, want the replica's holder", port, body, err)
		}
	}

	// A failing init container: the app never starts, the init
	// container restarts under backoff, the REASON names it.
	bad := echoApp("pod-bad", 1, "")
	bad.Namespace = ns
	apply(t, n1, bad.Deployment(func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.InitContainers = []corev1.Container{echo("migrate", "0", "check", "-exit", "3")}
	}))
	stuck, _, err := waitReplica(n1, ns, "pod-bad", 60*time.Second, func(r api.Replica) bool { return r.Phase == api.PhaseCrashLoopBackOff && r.Restarts >= 1 })
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stuck.Reason, "init container migrate") || !strings.Contains(stuck.Reason, "exit 3") {
		t.Errorf("REASON %q does not name the init container and its exit", stuck.Reason)
	}
	for _, cs := range stuck.Containers {
		if !cs.Init && cs.State != api.ContainerWaiting {
			t.Errorf("app container %s is %s while its init container fails", cs.Name, cs.State)
		}
	}
	if out, err := n1.CLI("get", "replicas", "-n", ns); err != nil || !strings.Contains(out, "Init:CrashLoopBackOff") {
		t.Errorf("get replicas does not show Init:CrashLoopBackOff:\n%s %v", out, err)
	}

	// Removal takes every container of the replicas, their logs and
	// the holder of the shared PID namespace.
	for _, name := range []string{"pod-web", "pod-bad", "pod-pids"} {
		if out, err := n1.CLI("delete", "deployment", "-n", ns, name); err != nil {
			t.Fatalf("delete %s: %v %s", name, err, out)
		}
	}
	if _, err := eventually(60*time.Second, func() error {
		if n := n1.RunningContainers(); n != 0 {
			return fmt.Errorf("%d containers still run", n)
		}
		logs, _ := filepath.Glob(filepath.Join(n1.DataDir, "logs", ns+"_*"))
		if len(logs) > 0 {
			return fmt.Errorf("log files left: %v", logs)
		}
		cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, f := range cmdlines {
			if b, _ := os.ReadFile(f); strings.Contains(string(b), "pid-holder") && strings.Contains(string(b), n1.DataDir) {
				return fmt.Errorf("a PID namespace holder still runs: %s", f)
			}
		}
		return nil
	}); err != nil {
		entries, _ := os.ReadDir(filepath.Join(n1.DataDir, "logs"))
		t.Fatalf("%v (logs dir: %v)", err, entries)
	}
}

// waitReplica waits up to timeout for the replica of workload
// namespace/name on node n (as its API lists it) for which ok holds,
// and returns it (or the last one seen, with the error) and the wait.
func waitReplica(n *harness.Node, namespace, workload string, timeout time.Duration, ok func(api.Replica) bool) (api.Replica, time.Duration, error) {
	var last api.Replica
	took, err := eventually(timeout, func() error {
		all, err := n.Replicas()
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Namespace == namespace && r.Workload == workload {
				if last = r; ok(r) {
					return nil
				}
			}
		}
		return fmt.Errorf("%s/%s: %s %q, restarts %d, containers %+v", namespace, workload, last.Phase, last.Reason, last.Restarts, last.Containers)
	})
	return last, took, err
}
