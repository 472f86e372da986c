package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

// The WordPress and MySQL tutorial's manifests (kubernetes.io,
// "Deploying WordPress and MySQL with Persistent Volumes") as written,
// but for the WordPress Service: NodePort where the tutorial asks for a
// LoadBalancer (issue 42).
const (
	mysqlYAML = `apiVersion: v1
kind: Service
metadata:
  name: wordpress-mysql
  labels:
    app: wordpress
spec:
  ports:
    - port: 3306
  selector:
    app: wordpress
    tier: mysql
  clusterIP: None
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: mysql-pv-claim
  labels:
    app: wordpress
spec:
  accessModes:
    - ReadWriteOnce
  resources:
    requests:
      storage: 20Gi
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: wordpress-mysql
  labels:
    app: wordpress
spec:
  selector:
    matchLabels:
      app: wordpress
      tier: mysql
  strategy:
    type: Recreate
  template:
    metadata:
      labels:
        app: wordpress
        tier: mysql
    spec:
      containers:
      - image: mysql:8.0
        name: mysql
        env:
        - name: MYSQL_ROOT_PASSWORD
          valueFrom:
            secretKeyRef:
              name: mysql-pass
              key: password
        - name: MYSQL_DATABASE
          value: wordpress
        - name: MYSQL_USER
          value: wordpress
        - name: MYSQL_PASSWORD
          valueFrom:
            secretKeyRef:
              name: mysql-pass
              key: password
        ports:
        - containerPort: 3306
          name: mysql
        volumeMounts:
        - name: mysql-persistent-storage
          mountPath: /var/lib/mysql
      volumes:
      - name: mysql-persistent-storage
        persistentVolumeClaim:
          claimName: mysql-pv-claim
`
	wordpressYAML = `apiVersion: v1
kind: Service
metadata:
  name: wordpress
  labels:
    app: wordpress
spec:
  ports:
    - port: 80
  selector:
    app: wordpress
    tier: frontend
  type: NodePort
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: wp-pv-claim
  labels:
    app: wordpress
spec:
  accessModes:
    - ReadWriteOnce
  resources:
    requests:
      storage: 20Gi
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: wordpress
  labels:
    app: wordpress
spec:
  selector:
    matchLabels:
      app: wordpress
      tier: frontend
  strategy:
    type: Recreate
  template:
    metadata:
      labels:
        app: wordpress
        tier: frontend
    spec:
      containers:
      - image: wordpress:6.2.1-apache
        name: wordpress
        env:
        - name: WORDPRESS_DB_HOST
          value: wordpress-mysql
        - name: WORDPRESS_DB_PASSWORD
          valueFrom:
            secretKeyRef:
              name: mysql-pass
              key: password
        - name: WORDPRESS_DB_USER
          value: wordpress
        ports:
        - containerPort: 80
          name: wordpress
        volumeMounts:
        - name: wordpress-persistent-storage
          mountPath: /var/www/html
      volumes:
      - name: wordpress-persistent-storage
        persistentVolumeClaim:
          claimName: wp-pv-claim
`
	wpKustomization = `secretGenerator:
- name: mysql-pass
  literals:
  - password=wp-pass-913
resources:
  - mysql-deployment.yaml
  - wordpress-deployment.yaml
`
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
	app := filepath.Join(dir, "wordpress")
	for name, text := range map[string]string{"mysql-deployment.yaml": mysqlYAML, "wordpress-deployment.yaml": wordpressYAML, "kustomization.yaml": wpKustomization} {
		if err := os.MkdirAll(app, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(app, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
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
		body, err := n1.PodHTTPGet("default", r.Name, "http://"+r.PodIP+":"+port+"/file?path=/proc/self/environ", 5*time.Second)
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
	if _, err := n1.PodHTTPPost("default", mysql[0].Name, "http://"+mysql[0].PodIP+":3306/file?path=/var/lib/mysql/ibdata1", "rows", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.CLI("rollout", "restart", "deployment/wordpress-mysql"); err != nil {
		t.Fatal(err)
	}
	mysql[0] = waitReplaced(t, n1, "wordpress-mysql", mysql[0].Name)
	if body, err := n1.PodHTTPGet("default", mysql[0].Name, "http://"+mysql[0].PodIP+":3306/file?path=/var/lib/mysql/ibdata1", 5*time.Second); err != nil || body != "rows" {
		t.Fatalf("the database's data after a rollout: %q %v", body, err)
	}
	out, err = n1.CLI("apply", "-k", app)
	if err != nil || strings.Count(out, "unchanged") != strings.Count(out, "\n") {
		t.Errorf("the same apply -k again: %v\n%s", err, out)
	}
}
