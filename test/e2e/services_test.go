package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

const servicesManifest = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: echo
        image: starling.local/echo:v1
        ports: [{name: http, containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: web-np}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: v1
kind: Service
metadata: {name: nobody}
spec:
  selector: {app: nobody}
  ports: [{port: 80}]
`

func clusterIP(t *testing.T, n *harness.Node, name string) string {
	t.Helper()
	out, err := n.CLI("get", "services", name, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Spec struct{ ClusterIP string }
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil || net.ParseIP(s.Spec.ClusterIP) == nil {
		t.Fatalf("service %s: %q %v", name, out, err)
	}
	return s.Spec.ClusterIP
}

func field(body, key string) string {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			return v
		}
	}
	return ""
}

// TestServicesClusterIPNodePortHairpinAndRepair: ClusterIP from a pod to
// backends on the same and other nodes keeps the client's pod address; a
// pod reaches itself through its Service (hairpin); NodePort works on
// every node from the LAN; a Service without endpoints refuses at once;
// flushed rules are back within 2 s.
func TestServicesClusterIPNodePortHairpinAndRepair(t *testing.T) {
	c := newCluster(t, 3)
	n1 := c.Nodes[0]
	if _, err := n1.CLI("image", "import", echoV1Tar); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.CLIInput(strings.NewReader(servicesManifest), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	_, err := eventually(60*time.Second, func() error {
		counts, _, err := perNode(n1, "web")
		if err != nil {
			return err
		}
		if counts["n1"] != 1 || counts["n2"] != 1 || counts["n3"] != 1 {
			return fmt.Errorf("want one web replica Running per node: %s", fmtCounts(counts))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := replicas(n1)
	podOf := map[string]replica{}
	var mine replica
	for _, r := range all {
		if r.Workload == "web" {
			podOf[r.PodIP] = r
			if r.Node == "n1" {
				mine = r
			}
		}
	}
	vip := clusterIP(t, n1, "web")

	// From the pod on n1, 30 requests to the ClusterIP reach all three
	// backends; other pods see the client's pod address, the pod itself
	// (hairpin) sees a node address.
	seen := map[string]bool{}
	_, err = eventually(20*time.Second, func() error {
		body, err := n1.PodHTTPGet("default", mine.Name, "http://"+vip+"/", time.Second)
		if err != nil {
			return err
		}
		backend, remote := field(body, "podIP"), field(body, "remote")
		remoteIP, _, _ := net.SplitHostPort(remote)
		if backend == mine.PodIP {
			if remoteIP == mine.PodIP {
				return fmt.Errorf("hairpin reply came from the pod's own address, not masqueraded")
			}
		} else if remoteIP != mine.PodIP {
			return fmt.Errorf("backend %s saw %s, want the client pod address %s", backend, remoteIP, mine.PodIP)
		}
		seen[backend] = true
		if len(seen) < 3 {
			return fmt.Errorf("reached %d of 3 backends", len(seen))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// NodePort on every node, from the LAN namespace.
	for _, n := range c.Nodes {
		var body string
		_, err := eventually(10*time.Second, func() (err error) {
			body, err = harness.HTTPGet(c.LAN, fmt.Sprintf("http://%s:30080/", n.IP), time.Second)
			return err
		})
		if err != nil || field(body, "podIP") == "" {
			t.Fatalf("NodePort on %s: %q %v", n.Name, body, err)
		}
	}

	// No endpoints: refused, quickly.
	nobody := clusterIP(t, n1, "nobody")
	start := time.Now()
	_, err = n1.PodHTTPGet("default", mine.Name, "http://"+nobody+"/", 5*time.Second)
	if err == nil || !errorIs(err, syscall.ECONNREFUSED) || time.Since(start) > 2*time.Second {
		t.Fatalf("service without endpoints from a pod: err %v after %v, want connection refused at once", err, time.Since(start))
	}
	start = time.Now()
	_, err = harness.HTTPGet(n1.NetNS, "http://"+nobody+"/", 5*time.Second)
	if err == nil || !errorIs(err, syscall.ECONNREFUSED) || time.Since(start) > 2*time.Second {
		t.Fatalf("service without endpoints from the node: err %v after %v, want connection refused at once", err, time.Since(start))
	}

	// Flushed nat and filter tables are repaired within 2 s.
	for _, flush := range [][]string{{"iptables", "-t", "nat", "-F"}, {"iptables", "-F"}} {
		if _, err := n1.Exec(t.Context(), flush[0], flush[1:]...); err != nil {
			t.Fatal(err)
		}
		took, err := eventually(3*time.Second, func() error {
			_, err := n1.PodHTTPGet("default", mine.Name, "http://"+vip+"/", 500*time.Millisecond)
			return err
		})
		if err != nil || took > 2*time.Second {
			t.Fatalf("after %v: service back after %v: %v", flush, took, err)
		}
		t.Logf("%s: service traffic back after %v", strings.Join(flush, " "), took.Round(time.Millisecond))
	}
}

func errorIs(err error, target syscall.Errno) bool {
	return err != nil && strings.Contains(err.Error(), target.Error())
}
