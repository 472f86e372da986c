package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

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
	web := harness.App{Name: "web", Namespace: "real", Replicas: 1, Container: "nginx", Image: "nginx:1.22",
		Ports: []corev1.ContainerPort{{ContainerPort: 80}}}
	cache := harness.App{Name: "cache", Namespace: "real", Replicas: 1, Container: "redis", Image: "redis:7.0",
		Ports: []corev1.ContainerPort{{ContainerPort: 6379}}, Grace: harness.Seconds(10),
		Readiness: harness.ExecProbe(0, "redis-cli", "-h", "localhost", "ping")}
	apply(t, n1, harness.Manifests(
		web.Deployment(),
		web.Service("web", []corev1.ServicePort{harness.ServicePort(8080, "80")}, func(s *corev1.ServiceSpec) { s.ClusterIP = "10.23.0.80" }),
		cache.Deployment()))
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
