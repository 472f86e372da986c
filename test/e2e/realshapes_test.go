package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

// TestWordPressShapedAppAppliesWithKustomize: the tutorial's files, a
// kustomization with a secretGenerator (its hash-suffixed name put in
// both Deployments' references), two claims, two Recreate Deployments
// and a headless Service, apply unchanged with apply -k (the images are
// stand-ins under the tutorial's names, the echo server listening on
// the tutorial's ports). Both run with the password; the database's
// data survives a rollout; the same apply again changes nothing.
func TestWordPressShapedAppAppliesWithKustomize(t *testing.T) {
	t.Parallel()
	mod, err := harness.ModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := newCluster(t, 1)
	n1 := c.Nodes[0]
	for ref, port := range map[string]string{"mysql:8.0": "3306", "wordpress:6.2.1-apache": "80"} {
		tar := filepath.Join(dir, port+".tar")
		if err := imagebuild.EchoWith(ctx, mod, imagebuild.Spec{Ref: "docker.io/library/" + ref, Env: []string{"PORT=" + port}}, tar); err != nil {
			t.Fatal(err)
		}
		if out, err := n1.CLI("image", "import", tar); err != nil {
			t.Fatalf("import %s: %v %s", ref, err, out)
		}
	}
	// The WordPress and MySQL tutorial's files (kubernetes.io, "Deploying
	// WordPress and MySQL with Persistent Volumes") as written, but for
	// the WordPress Service: a NodePort where the tutorial asks for a
	// LoadBalancer (issue 42); and its kustomization.
	app, err := filepath.Abs("testdata/wordpress")
	if err != nil {
		t.Fatal(err)
	}
	out, err := n1.CLI("apply", "-k", app)
	if err != nil {
		t.Fatalf("apply -k: %v\n%s", err, out)
	}
	t.Logf("apply -k:\n%s", out)
	mysql, _ := waitRunning(t, n1, "wordpress-mysql", 1, 90*time.Second)
	wp, _ := waitRunning(t, n1, "wordpress", 1, 90*time.Second)
	if out, err := n1.CLI("get", "pvc"); err != nil || strings.Count(out, "Bound") != 2 {
		t.Fatalf("get pvc: %v\n%s", err, out)
	}
	environ := func(r replica) []string {
		t.Helper()
		port := map[string]string{"wordpress-mysql": "3306", "wordpress": "80"}[r.Workload]
		body, err := n1.ReplicaHTTPGet("default", r.Name, "http://"+r.PodIP+":"+port+"/file?path=/proc/self/environ", 5*time.Second)
		if err != nil {
			t.Fatalf("read %s's environment: %v %s", r.Name, err, body)
		}
		return strings.Split(body, "\x00")
	}
	for _, want := range []string{"WORDPRESS_DB_PASSWORD=wp-pass-913", "WORDPRESS_DB_HOST=wordpress-mysql"} {
		if env := environ(wp[0]); !slices.Contains(env, want) {
			t.Errorf("wordpress lacks %s: %q", want, env)
		}
	}
	if env := environ(mysql[0]); !slices.Contains(env, "MYSQL_PASSWORD=wp-pass-913") {
		t.Errorf("mysql lacks its password: %q", env)
	}
	if _, err := n1.ReplicaHTTPPost("default", mysql[0].Name, "http://"+mysql[0].PodIP+":3306/file?path=/var/lib/mysql/ibdata1", "rows", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.CLI("rollout", "restart", "deployment/wordpress-mysql"); err != nil {
		t.Fatal(err)
	}
	mysql[0] = waitReplaced(t, n1, "wordpress-mysql", mysql[0].Name)
	if body, err := n1.ReplicaHTTPGet("default", mysql[0].Name, "http://"+mysql[0].PodIP+":3306/file?path=/var/lib/mysql/ibdata1", 5*time.Second); err != nil || body != "rows" {
		t.Fatalf("the database's data after a rollout: %q %v", body, err)
	}
	out, err = n1.CLI("apply", "-k", app)
	if err != nil || strings.Count(out, "unchanged") != strings.Count(out, "\n") {
		t.Errorf("the same apply -k again: %v\n%s", err, out)
	}
}
