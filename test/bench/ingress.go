package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/test/harness"
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
	fmt.Println("Starling Ingress benchmark (1 node, the echo pod, GET / kept alive, from the node's namespace)")
	fmt.Printf("%-8s %-22s %12s %10s %10s\n", "clients", "path", "requests/s", "p50", "p99")
	for _, conc := range []int{1, 16} {
		var rows [2]result
		for i, url := range []string{direct, proxied} {
			r, err := measure(n, url, conc, duration)
			if err != nil {
				return err
			}
			rows[i] = r
			what := "direct to the pod"
			if i == 1 {
				what = "through the Ingress"
			}
			fmt.Printf("%-8d %-22s %12.0f %10s %10s\n", conc, what, r.rps, r.p50, r.p99)
		}
		fmt.Printf("%-8d %-22s %11.0f%% %10s %10s\n", conc, "Ingress vs direct", 100*rows[1].rps/rows[0].rps,
			signed(rows[1].p50-rows[0].p50), signed(rows[1].p99-rows[0].p99))
	}
	return nil
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
