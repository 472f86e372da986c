package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// A host whose FORWARD policy is DROP (Docker sets it) breaks nothing the
// agent runs: pod to pod across nodes, pod to ClusterIP, NodePort from the
// LAN and node to ClusterIP, each reaching backends on the other nodes
// too. Before, every path but a pod reaching itself failed; with the
// workaround users were told (-I FORWARD -s <cluster CIDR> -j ACCEPT)
// NodePort and node-to-ClusterIP traffic still failed whenever the backend
// was on another node, where it arrives from a node address. And a
// connection to a NodePort on 127.0.0.1 is refused at once (it hung for
// the client's whole timeout: the kernel does not route 127.0.0.0/8 to a
// pod).
func TestServicesWorkWithForwardPolicyDropAndLocalhostNodePortIsRefused(t *testing.T) {
	c := newCluster(t, 3)
	n1 := c.Nodes[0]
	for _, n := range c.Nodes {
		if _, err := n.Exec(t.Context(), "iptables", "-P", "FORWARD", "DROP"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n1.CLI("image", "import", echoV1Tar); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.CLIInput(strings.NewReader(servicesManifest), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	web := map[string]string{} // node -> web pod IP
	var client replica         // on n1
	_, err := eventually(60*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Phase != api.PhaseRunning || !r.Ready {
				continue
			}
			switch {
			case r.Workload == "web":
				web[r.Node] = r.PodIP
			case r.Workload == "client" && r.Node == "n1":
				client = r
			}
		}
		if len(web) != 3 || client.Name == "" {
			return fmt.Errorf("want a ready web replica on each node and a client on n1: web %v, client %q", web, client.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	backends := map[string]bool{}
	for _, ip := range web {
		backends[ip] = true
	}
	// reachesAll gets until every web backend answered.
	reachesAll := func(what string, get func() (string, error)) {
		t.Helper()
		seen := map[string]bool{}
		_, err := eventually(20*time.Second, func() error {
			body, err := get()
			if err != nil {
				return err
			}
			seen[field(body, "podIP")] = true
			for ip := range backends {
				if !seen[ip] {
					return fmt.Errorf("reached %v of backends %v", seen, backends)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s with FORWARD policy DROP: %v", what, err)
		}
	}
	vip := clusterIP(t, n1, "web")
	for _, node := range []string{"n2", "n3"} {
		if _, err := n1.PodHTTPGet("default", client.Name, "http://"+web[node]+":8080/", 2*time.Second); err != nil {
			t.Fatalf("pod on n1 to pod on %s with FORWARD policy DROP: %v", node, err)
		}
	}
	reachesAll("pod to ClusterIP", func() (string, error) {
		return n1.PodHTTPGet("default", client.Name, "http://"+vip+"/", time.Second)
	})
	reachesAll("NodePort from the LAN", func() (string, error) {
		return harness.HTTPGet(c.LAN, fmt.Sprintf("http://%s:30080/", n1.IP), time.Second)
	})
	reachesAll("node to ClusterIP", func() (string, error) {
		return harness.HTTPGet(n1.NetNS, "http://"+vip+"/", time.Second)
	})

	// localhost:NodePort: refused at once, on every node.
	for _, n := range c.Nodes {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := harness.DialIn(n.NetNS)(ctx, "tcp", "127.0.0.1:30080")
		cancel()
		if err == nil {
			conn.Close()
		}
		if err == nil || !errorIs(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
			t.Fatalf("127.0.0.1:30080 on %s: %v after %v, want connection refused at once", n.Name, err, time.Since(start))
		}
		// The node's own LAN address still answers.
		if _, err := harness.HTTPGet(n.NetNS, fmt.Sprintf("http://%s/", net.JoinHostPort(n.IP, "30080")), 2*time.Second); err != nil {
			t.Fatalf("NodePort on %s's own address from the node: %v", n.Name, err)
		}
	}
}
