package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// TestRealSoftwareRunsUnchanged: nginx and redis from Debian's packages,
// imported as 'docker save'-style tarballs under short names (nginx:1.22,
// redis:7.0), run as their images say. nginx serves through a ClusterIP
// Service and, deleted, gets its image's StopSignal SIGQUIT (its own log
// line says so, seen with 'logs -f'); redis runs as the image's user
// redis, becomes ready by the exec probe 'redis-cli -h localhost ping'
// (localhost resolves through the replica's /etc/hosts) and, deleted,
// saves its data and says goodbye.
func TestRealSoftwareRunsUnchanged(t *testing.T) {
	if realSkip != "" {
		t.Skip("no images of Debian's nginx and redis: " + realSkip)
	}
	c := newCluster(t, 1)
	n1 := c.Nodes[0]
	for _, f := range []string{nginxTar, redisTar} {
		if out, err := n1.CLI("image", "import", f); err != nil {
			t.Fatalf("image import: %v %s", err, out)
		}
	}
	apply(t, n1, `apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: real}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: nginx
        image: nginx:1.22
        ports: [{containerPort: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: real}
spec:
  selector: {app: web}
  ports: [{port: 8080, targetPort: 80}]
  clusterIP: 10.23.0.80
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: cache, namespace: real}
spec:
  replicas: 1
  selector: {matchLabels: {app: cache}}
  template:
    metadata: {labels: {app: cache}}
    spec:
      terminationGracePeriodSeconds: 10
      containers:
      - name: redis
        image: redis:7.0
        ports: [{containerPort: 6379}]
        readinessProbe:
          exec: {command: [redis-cli, -h, localhost, ping]}
          periodSeconds: 1
`)
	names := map[string]string{}
	waitFor(t, 90*time.Second, func() error {
		items, err := apiReplicas(n1)
		if err != nil {
			return err
		}
		for _, r := range items {
			if r.Namespace == "real" && r.Ready {
				names[r.Workload] = r.Name
			}
		}
		if len(names) != 2 {
			return fmt.Errorf("want web and cache ready: %+v", items)
		}
		return nil
	})
	waitFor(t, 20*time.Second, func() error {
		body, err := harness.HTTPGet(n1.NetNS, "http://10.23.0.80:8080/", 2*time.Second)
		if err != nil || body != "hello from nginx\n" {
			return fmt.Errorf("GET the Service: %q %v", body, err)
		}
		return nil
	})
	if out, err := n1.CLI("logs", "-n", "real", names["cache"]); err != nil || !strings.Contains(out, "Ready to accept connections") {
		t.Fatalf("redis log: %v\n%s", err, out)
	}
	follow := func(name string) chan string {
		ch := make(chan string, 1)
		go func() {
			out, err := n1.CLI("logs", "-n", "real", "-f", name)
			if err != nil {
				out += err.Error()
			}
			ch <- out
		}()
		return ch
	}
	webLog, cacheLog := follow(names["web"]), follow(names["cache"])
	time.Sleep(2 * time.Second)
	for _, w := range []string{"web", "cache"} {
		if _, err := n1.CLI("delete", "deployment", w, "-n", "real"); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range []struct {
		name string
		log  chan string
		want []string
	}{
		{"nginx", webLog, []string{"signal 3 (SIGQUIT) received", "gracefully shutting down"}},
		{"redis", cacheLog, []string{"Received SIGTERM scheduling shutdown", "DB saved on disk", "Redis is now ready to exit"}},
	} {
		select {
		case out := <-x.log:
			for _, w := range x.want {
				if !strings.Contains(out, w) {
					t.Errorf("%s's log (logs -f until it ended) lacks %q:\n%s", x.name, w, out)
				}
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("logs -f of %s did not end", x.name)
		}
	}
}
