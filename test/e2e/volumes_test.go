package e2e

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/starling-orchestrator/starling/node/api"
)

// TestVolumesProjectConfigAndFollowItsChanges: a replica mounts a
// ConfigMap (and one key of it by subPath), a Secret, the downward API
// and a memory emptyDir. It reads them; a changed ConfigMap reaches the
// mounted file within 10 s, with no restart, while the subPath file
// keeps what it held (as in Kubernetes); projected volumes are
// read-only, the emptyDir writable; the Secret's files are on tmpfs,
// never on the node's disk; the replica's removal unmounts them.
func TestVolumesProjectConfigAndFollowItsChanges(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	n1 := c.Nodes[0]
	importEcho(t, n1)
	const ns = "volproj"
	apply(t, n1, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: "+ns+"}\ndata: {app.conf: color=blue, mode: fast}\n---\n"+
		"apiVersion: v1\nkind: Secret\nmetadata: {name: creds, namespace: "+ns+"}\nstringData: {password: vol-secret-5e1}\n")
	app := echoApp("volproj-web", 1, "")
	app.Namespace = ns
	apply(t, n1, app.Deployment(func(d *appsv1.Deployment) {
		spec := &d.Spec.Template.Spec
		spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptrTo[int64](2000)}
		size := resource.MustParse("8Mi")
		spec.Volumes = []corev1.Volume{
			{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
			{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
			{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
				{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &size}}},
		}
		spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
			{Name: "cfg", MountPath: "/etc/app"},
			{Name: "cfg", MountPath: "/etc/pinned.conf", SubPath: "app.conf"},
			{Name: "sec", MountPath: "/etc/secret"},
			{Name: "info", MountPath: "/etc/podinfo"},
			{Name: "scratch", MountPath: "/scratch"},
		}
	}))
	all, _ := waitRunning(t, n1, "volproj-web", 1, 60*time.Second)
	web := all[0]
	get := func(path string) string {
		t.Helper()
		body, err := n1.ReplicaHTTPGet(ns, web.Name, "http://"+web.PodIP+":8080/file?path="+path, 5*time.Second)
		if err != nil {
			t.Fatalf("read %s in the replica: %v %s", path, err, body)
		}
		return body
	}
	for path, want := range map[string]string{
		"/etc/app/app.conf": "color=blue", "/etc/app/mode": "fast", "/etc/pinned.conf": "color=blue",
		"/etc/secret/password": "vol-secret-5e1", "/etc/podinfo/name": web.Name, "/etc/podinfo/labels": `app="volproj-web"`,
	} {
		if got := get(path); got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
	if _, err := n1.ReplicaHTTPPost(ns, web.Name, "http://"+web.PodIP+":8080/file?path=/scratch/note", "written", 5*time.Second); err != nil {
		t.Fatalf("write to the emptyDir: %v", err)
	}
	// fsGroup: a supplementary group of the container, the group of the
	// emptyDir's new files and of the projected ones.
	if report, err := n1.ReplicaHTTPGet(ns, web.Name, "http://"+web.PodIP+":8080/sandbox", 5*time.Second); err != nil || !strings.Contains(report, "2000") {
		t.Errorf("the container's groups do not hold the fsGroup: %q %v", report, err)
	}
	vols := n1.DataDir + "/pods/" + ns + "_" + web.Name + "/volumes/"
	for _, p := range []string{vols + "scratch/note", vols + "cfg/app.conf"} {
		if info, err := os.Stat(p); err != nil || info.Sys().(*syscall.Stat_t).Gid != 2000 {
			t.Errorf("%s: not of the fsGroup: %v %v", p, info, err)
		}
	}
	if _, err := n1.ReplicaHTTPPost(ns, web.Name, "http://"+web.PodIP+":8080/file?path=/etc/app/new", "x", 5*time.Second); err == nil || !strings.Contains(err.Error(), "read-only file system") {
		t.Errorf("write to a ConfigMap volume: %v, want read-only file system", err)
	}
	// The Secret's and the memory emptyDir's files are on tmpfs.
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	tmpfs := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(mounts)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 8 && strings.HasPrefix(f[4], n1.DataDir) && strings.Contains(sc.Text(), " - tmpfs ") {
			tmpfs[f[4][strings.LastIndex(f[4], "/")+1:]] = true
		}
	}
	if !tmpfs["sec"] || !tmpfs["scratch"] || tmpfs["cfg"] {
		t.Errorf("tmpfs volumes under the data dir: %v, want sec and scratch only", tmpfs)
	}

	// The ConfigMap changes: the mounted file follows, the subPath
	// file does not, nothing restarts.
	changed := time.Now()
	apply(t, n1, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: "+ns+"}\ndata: {app.conf: color=green, mode: fast}\n")
	took, err := eventually(10*time.Second, func() error {
		if got := get("/etc/app/app.conf"); got != "color=green" {
			return fmt.Errorf("app.conf is %q", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the mounted file changed %v after the apply (%v since)", took.Round(time.Millisecond), time.Since(changed).Round(time.Millisecond))
	if got := get("/etc/pinned.conf"); got != "color=blue" {
		t.Errorf("the subPath file changed to %q (Kubernetes does not update a subPath mount)", got)
	}
	if got := get("/scratch/note"); got != "written" {
		t.Errorf("the emptyDir lost its file: %q", got)
	}
	now, err := replicas(n1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range now {
		if r.Namespace == ns && (r.Name != web.Name || r.Restarts != 0 || r.Phase != api.PhaseRunning) {
			t.Fatalf("the change restarted or replaced the replica: %+v", r)
		}
	}
	// A restart after the update (a crash) mounts the same files: the
	// subPath copy is still there, the volume holds the new file.
	if _, err := n1.ReplicaHTTPPost(ns, web.Name, "http://"+web.PodIP+":8080/exit", "", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := eventually(60*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Namespace == ns && r.Restarts == 1 && r.Phase == api.PhaseRunning {
				web = r
				return nil
			}
		}
		return fmt.Errorf("not restarted and running: %+v", all)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := eventually(10*time.Second, func() error {
		if got := get("/etc/pinned.conf") + "|" + get("/etc/app/app.conf"); got != "color=blue|color=green" {
			return fmt.Errorf("after the restart: %q", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Deleted: its volumes are unmounted and removed.
	if _, err := n1.CLI("delete", "deployment", "volproj-web", "-n", ns); err != nil {
		t.Fatal(err)
	}
	if _, err := eventually(30*time.Second, func() error {
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		if strings.Contains(string(mounts), n1.DataDir+"/pods/") {
			return fmt.Errorf("volumes still mounted")
		}
		if _, err := os.Stat(n1.DataDir + "/pods/" + ns + "_" + web.Name); err == nil {
			return fmt.Errorf("the pod directory is still there")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestEmptyDirOverItsSizeLimitIsEvicted: a replica that writes more
// into an emptyDir on disk than its sizeLimit is replaced by a fresh
// copy with a new, empty emptyDir, and the agent says why in the
// kubelet's words.
func TestEmptyDirOverItsSizeLimitIsEvicted(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1)
	n1 := c.Nodes[0]
	importEcho(t, n1)
	const ns = "volevict"
	app := echoApp("volevict-web", 1, "")
	app.Namespace = ns
	apply(t, n1, app.Deployment(func(d *appsv1.Deployment) {
		size := resource.MustParse("1Mi")
		d.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &size}}}}
		d.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}
	}))
	all, _ := waitRunning(t, n1, "volevict-web", 1, 60*time.Second)
	web := all[0]
	mib := strings.Repeat("x", 1<<20)
	for _, f := range []string{"a", "b"} {
		if _, err := n1.ReplicaHTTPPost(ns, web.Name, "http://"+web.PodIP+":8080/file?path=/scratch/"+f, mib, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	wrote := time.Now()
	took, err := eventually(60*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Namespace == ns && r.Phase == api.PhaseRunning && r.PodIP != "" {
				if _, err := n1.ReplicaHTTPGet(ns, r.Name, "http://"+r.PodIP+":8080/file?path=/scratch/a", 2*time.Second); err != nil && strings.Contains(err.Error(), "404") {
					return nil // a fresh copy: its emptyDir is empty
				}
			}
		}
		return fmt.Errorf("not evicted yet")
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("evicted and running again with an empty emptyDir %v after the writes (%v since)", took.Round(time.Millisecond), time.Since(wrote).Round(time.Millisecond))
	if log, _ := os.ReadFile(n1.AgentLogPath()); !strings.Contains(string(log), `Evicted: Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\".`) {
		t.Fatalf("the agent does not say why:\n%s", n1.Tail(20))
	}
}
