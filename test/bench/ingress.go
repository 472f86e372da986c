package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

// ingressBench measures, side by side on one node, HTTP requests to the
// echo pod straight to its address against the same requests through
// the node's Ingress proxy (port 80, routed by host and path), from
// the node's network namespace with kept-alive connections: requests
// per second and the median and 99th percentile latency, at 1 and at 16
// concurrent clients, for duration each.
func ingressBench(a artifacts, duration time.Duration) error {
	c, n, err := firstNode(a, "ingress", "sting", "ing1")
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := n.CLI("image", "import", a.echoTar); err != nil {
		return err
	}
	app := harness.App{Name: "echo", Replicas: 1, Grace: harness.Seconds(2), Ports: harness.Port8080}
	doc := app.Deployment() + "---\n" + app.Service("echo", []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}) + `---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: echo}
spec:
  rules:
  - host: bench.test
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: echo, port: {number: 80}}}}
`
	if _, err := n.CLIInput(strings.NewReader(doc), "apply", "-f", "-"); err != nil {
		return err
	}
	if err := waitFor(2*time.Minute, func() (bool, error) { return availableReplica(n, "echo") }); err != nil {
		return err
	}
	reps, err := n.Replicas()
	if err != nil || len(reps) != 1 {
		return fmt.Errorf("replicas: %v %v", reps, err)
	}
	direct := "http://" + reps[0].PodIP + ":8080/"
	proxied := "http://" + n.IP + ":80/"
	// Wait until the proxy routes (its table follows the view).
	if err := waitFor(30*time.Second, func() (bool, error) {
		_, err := loadLatencies(n, proxied, 1, 200*time.Millisecond)
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("the Ingress does not route: %w", err)
	}
	paths := []struct{ what, short, url string }{{"direct to the pod", "direct", direct}, {"through the Ingress", "Ingress", proxied}}
	if url, err := nginxProxy(a, n, direct); err != nil {
		fmt.Println("(no nginx row:", err, ")")
	} else {
		paths = append(paths, struct{ what, short, url string }{"through nginx (a pod)", "nginx", url})
	}
	fmt.Println("Starling Ingress benchmark (1 node, the echo pod, GET / kept alive, from the node's namespace)")
	fmt.Printf("%-8s %-22s %12s %10s %10s\n", "clients", "path", "requests/s", "p50", "p99")
	for _, conc := range []int{1, 16} {
		var rows []result
		for _, p := range paths {
			r, err := measure(n, p.url, conc, duration)
			if err != nil {
				return err
			}
			rows = append(rows, r)
			fmt.Printf("%-8d %-22s %12.0f %10s %10s\n", conc, p.what, r.rps, r.p50, r.p99)
		}
		for i := 1; i < len(rows); i++ {
			fmt.Printf("%-8d %-22s %11.0f%% %10s %10s\n", conc, paths[i].short+" vs direct", 100*rows[i].rps/rows[0].rps,
				signed(rows[i].p50-rows[0].p50), signed(rows[i].p99-rows[0].p99))
		}
	}
	return nil
}

// nginxProxy runs Debian's nginx in a pod on n as a reverse proxy to
// the echo pod at direct (kept-alive upstream connections, no access
// log), a reference for the Ingress proxy's figures, and returns its
// URL.
func nginxProxy(a artifacts, n *harness.Node, direct string) (string, error) {
	debs := os.Getenv("STARLING_TEST_DEBS")
	if debs == "" {
		debs = "/var/cache/starling/test-debs"
	}
	tar := filepath.Join(a.dir, "nginx.tar")
	if err := imagebuild.Nginx(context.Background(), debs, "nginx:1.22", tar); err != nil {
		return "", err
	}
	if _, err := n.CLI("image", "import", tar); err != nil {
		return "", err
	}
	upstream := strings.TrimSuffix(strings.TrimPrefix(direct, "http://"), "/")
	conf := `user www-data;
worker_processes auto;
daemon off;
error_log /dev/stderr notice;
pid /run/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path /tmp/client_body;
  proxy_temp_path /tmp/proxy;
  fastcgi_temp_path /tmp/fastcgi;
  uwsgi_temp_path /tmp/uwsgi;
  scgi_temp_path /tmp/scgi;
  upstream echo { server ` + upstream + `; keepalive 32; }
  server {
    listen 80;
    location / { proxy_pass http://echo; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header Host $host; }
  }
}
`
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Name: "nginx-conf"}, Data: map[string]string{"nginx.conf": conf}}
	cmYAML, err := yaml.Marshal(cm)
	if err != nil {
		return "", err
	}
	app := harness.App{Name: "nginx", Replicas: 1, Image: "nginx:1.22", Container: "nginx", Grace: harness.Seconds(2),
		Command: []string{"/usr/sbin/nginx", "-c", "/conf/nginx.conf"},
		Pod: func(p *corev1.PodSpec) {
			p.Volumes = []corev1.Volume{{Name: "conf", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nginx-conf"}}}}}
			p.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "conf", MountPath: "/conf"}}
		}}
	if _, err := n.CLIInput(strings.NewReader(string(cmYAML)+"---\n"+app.Deployment()), "apply", "-f", "-"); err != nil {
		return "", err
	}
	if err := waitFor(2*time.Minute, func() (bool, error) { return availableReplica(n, "nginx") }); err != nil {
		return "", err
	}
	reps, err := n.Replicas()
	if err != nil {
		return "", err
	}
	for _, r := range reps {
		if r.Workload == "nginx" {
			url := "http://" + r.PodIP + ":80/"
			return url, waitFor(30*time.Second, func() (bool, error) {
				_, err := loadLatencies(n, url, 1, 200*time.Millisecond)
				return err == nil, err
			})
		}
	}
	return "", fmt.Errorf("no nginx replica")
}

type result struct {
	rps      float64
	p50, p99 time.Duration
}

// measure runs conc clients against url for d and sums them up.
func measure(n *harness.Node, url string, conc int, d time.Duration) (result, error) {
	lat, err := loadLatencies(n, url, conc, d)
	if err != nil {
		return result{}, err
	}
	slices.Sort(lat)
	return result{rps: float64(len(lat)) / d.Seconds(), p50: lat[len(lat)/2].Round(time.Microsecond), p99: lat[len(lat)*99/100].Round(time.Microsecond)}, nil
}

// loadLatencies runs conc clients, each sending GET url (Host
// bench.test) one after the other on one kept-alive connection, from
// n's namespace, for d; it returns every request's latency and fails on
// any answer but 200.
func loadLatencies(n *harness.Node, url string, conc int, d time.Duration) ([]time.Duration, error) {
	tr := &http.Transport{DialContext: harness.DialIn(n.NetNS), MaxIdleConnsPerHost: conc}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var all []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for ctx.Err() == nil {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Host = "bench.test"
				start := time.Now()
				resp, err := cl.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("%s: status %d", url, resp.StatusCode)
					}
				}
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("%s: no request completed", url)
	}
	return all, nil
}

// signed is d with its sign ("+1ms", "-2ms").
func signed(d time.Duration) string {
	if d < 0 {
		return d.String()
	}
	return "+" + d.String()
}
