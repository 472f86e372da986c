package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// servicesManifest is web, 3 echo servers with their port named http,
// behind a ClusterIP Service (port 80, named http) and a NodePort one
// (30080); 3 clients; and a Service that selects no pod.
var servicesManifest = func() string {
	web := harness.App{Name: "web", Replicas: 3, Grace: harness.Seconds(2), Ports: harness.HTTPPort}
	return harness.Manifests(
		web.Deployment(),
		web.Service("web", []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}),
		web.Service("web-np", []corev1.ServicePort{harness.ServicePort(80, "8080")}, func(s *corev1.ServiceSpec) {
			s.Type = corev1.ServiceTypeNodePort
			s.Ports[0].NodePort = 30080
		}),
		harness.App{Name: "client", Replicas: 3, Grace: harness.Seconds(1)}.Deployment(),
		harness.App{Name: "nobody"}.Service("nobody", []corev1.ServicePort{harness.ServicePort(80, "")}),
	)
}()

// linkedManifest is two echo servers whose MESSAGE refers to web's
// Service variables: linked gets them (enableServiceLinks, the default),
// unlinked does not.
var linkedManifest = func() string {
	app := func(name string) harness.App {
		return harness.App{Name: name, Replicas: 1, Grace: harness.Seconds(1),
			Env: harness.Env("MESSAGE", "$(WEB_SERVICE_HOST):$(WEB_SERVICE_PORT_HTTP) $(WEB_NP_PORT)")}
	}
	unlinked := app("unlinked")
	unlinked.Pod = func(p *corev1.PodSpec) {
		links := false
		p.EnableServiceLinks = &links
	}
	return harness.Manifests(app("linked").Deployment(), unlinked.Deployment())
}()

// oneWebPerNode says whether n sees one replica of servicesManifest's web
// Running on each of n1, n2 and n3.
func oneWebPerNode(n *harness.Node) error {
	counts, _, err := perNode(n, "web")
	if err != nil {
		return err
	}
	if counts["n1"] != 1 || counts["n2"] != 1 || counts["n3"] != 1 {
		return fmt.Errorf("want one web replica Running per node: %s", fmtCounts(counts))
	}
	return nil
}

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
	importEcho(t, n1)
	apply(t, n1, servicesManifest)
	_, err := eventually(60*time.Second, func() error { return oneWebPerNode(n1) })
	if err != nil {
		t.Fatal(err)
	}
	var mine, client replica // web and client replicas on n1
	_, err = eventually(30*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Node == "n1" && r.Phase == api.PhaseRunning && r.Workload == "web" {
				mine = r
			}
			if r.Node == "n1" && r.Phase == api.PhaseRunning && r.Workload == "client" {
				client = r
			}
		}
		if mine.Name == "" || client.Name == "" {
			return fmt.Errorf("no web and client replica Running on n1 yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	vip := clusterIP(t, n1, "web")

	// From the client pod on n1, requests to the ClusterIP reach all three
	// backends, the one on the same node and the two on other nodes, and
	// every backend sees the client's pod address.
	seen := map[string]bool{}
	_, err = eventually(20*time.Second, func() error {
		body, err := n1.PodHTTPGet("default", client.Name, "http://"+vip+"/", time.Second)
		if err != nil {
			return err
		}
		backend, remote := field(body, "podIP"), field(body, "remote")
		if remoteIP, _, _ := net.SplitHostPort(remote); remoteIP != client.PodIP {
			return fmt.Errorf("backend %s saw %s, want the client pod address %s", backend, remoteIP, client.PodIP)
		}
		seen[backend] = true
		if !seen[mine.PodIP] || len(seen) < 3 {
			return fmt.Errorf("reached %d of 3 backends (same-node %v)", len(seen), seen[mine.PodIP])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Hairpin: the web pod on n1 reaches itself through its Service; its
	// own reply comes back masqueraded (else it would answer itself
	// directly and drop the reply).
	_, err = eventually(20*time.Second, func() error {
		body, err := n1.PodHTTPGet("default", mine.Name, "http://"+vip+"/", time.Second)
		if err != nil {
			return err
		}
		if field(body, "podIP") != mine.PodIP {
			return fmt.Errorf("not served by itself yet")
		}
		if remoteIP, _, _ := net.SplitHostPort(field(body, "remote")); remoteIP == mine.PodIP {
			return fmt.Errorf("hairpin request arrived from the pod's own address: not masqueraded")
		}
		return nil
	})
	if err != nil {
		t.Fatal("hairpin: ", err)
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

	// Service variables (enableServiceLinks, the default): a container
	// created after the Services gets the kubelet's variables, its env may
	// refer to them; with enableServiceLinks: false it gets none, and the
	// references stay as written.
	npIP := clusterIP(t, n1, "web-np")
	apply(t, n1, linkedManifest)
	for workload, want := range map[string]string{
		"linked":   vip + ":80 tcp://" + npIP + ":80",
		"unlinked": "$(WEB_SERVICE_HOST):$(WEB_SERVICE_PORT_HTTP) $(WEB_NP_PORT)",
	} {
		_, err := eventually(30*time.Second, func() error {
			all, err := replicas(n1)
			if err != nil {
				return err
			}
			for _, r := range all {
				if r.Workload != workload || r.Phase != api.PhaseRunning {
					continue
				}
				body, err := harness.HTTPGet(c.Nodes[0].NetNS, "http://"+r.PodIP+":8080/", time.Second)
				if err != nil {
					return err
				}
				if got := field(body, "message"); got != want {
					return fmt.Errorf("%s: message=%q, want %q", workload, got, want)
				}
				return nil
			}
			return fmt.Errorf("%s: no replica Running", workload)
		})
		if err != nil {
			t.Fatal(err)
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

	// Flushed or deleted rules are repaired within 2 s: the Service
	// rules, and the pod masquerade (pod to outside the cluster CIDR
	// leaves with the node's address), which used to stay gone after a
	// flush of the nat table.
	srv, err := harness.ServeIn(c.LAN, harness.LANPrefix+".254:9000")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	flushes := [][]string{{"iptables", "-t", "nat", "-F"}, {"iptables", "-F"}}
	if n1.ProxyMode() == "nftables" {
		flushes = [][]string{{"nft", "flush", "table", "ip", "starling"}, {"nft", "delete", "table", "ip", "starling"}, {"nft", "flush", "ruleset"}}
	}
	for _, flush := range flushes {
		if _, err := n1.Exec(t.Context(), flush[0], flush[1:]...); err != nil {
			t.Fatal(err)
		}
		took, err := eventually(3*time.Second, func() error {
			if _, err := n1.PodHTTPGet("default", mine.Name, "http://"+vip+"/", 500*time.Millisecond); err != nil {
				return err
			}
			body, err := n1.PodHTTPGet("default", mine.Name, "http://"+harness.LANPrefix+".254:9000/", 500*time.Millisecond)
			if err != nil || !strings.Contains(body, "remote="+n1.IP+":") {
				return fmt.Errorf("pod -> outside: %q %v, want the node address %s as source", body, err, n1.IP)
			}
			return nil
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

// TestServiceNetworkSurvivesRestartsCutsAndBridgeNetfilterOff: an agent
// restart during a request loop fails no request; with
// bridge-nf-call-iptables forced off Services still work (backends then
// see a node address); pod traffic to an address outside the cluster CIDR
// is masqueraded to the node address; a node cut off leaves every other
// node's rules.
func TestServiceNetworkSurvivesRestartsCutsAndBridgeNetfilterOff(t *testing.T) {
	c := newCluster(t, 3)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	importEcho(t, n1)
	apply(t, n1, servicesManifest)
	var mine replica
	_, err := eventually(60*time.Second, func() error {
		if err := oneWebPerNode(n1); err != nil {
			return err
		}
		all, _ := replicas(n1)
		for _, r := range all {
			if r.Workload == "web" && r.Node == "n1" {
				mine = r
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	vip := clusterIP(t, n1, "web")
	get := func() (string, error) {
		return n1.PodHTTPGet("default", mine.Name, "http://"+vip+"/", 2*time.Second)
	}
	if _, err := eventually(20*time.Second, func() error { _, err := get(); return err }); err != nil {
		t.Fatal(err)
	}

	// Agent restart during a request loop: no request fails.
	stop := make(chan struct{})
	failures := make(chan error, 1000)
	done := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			if _, err := get(); err != nil {
				failures <- err
			}
			n++
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	n1.KillAgent(syscall.SIGTERM)
	if err := n1.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	close(stop)
	requests := <-done
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed across the agent restart, first: %v", len(failures), requests, <-failures)
	}
	t.Logf("agent restart: %d requests, none failed", requests)

	// Pod to an address outside the cluster CIDR (the LAN namespace):
	// masqueraded to the node's address.
	srv, err := harness.ServeIn(c.LAN, harness.LANPrefix+".254:9000")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	body, err := n1.PodHTTPGet("default", mine.Name, "http://"+harness.LANPrefix+".254:9000/", 2*time.Second)
	if err != nil || !strings.Contains(body, "remote="+n1.IP+":") {
		t.Fatalf("pod -> outside: %q %v, want the node address %s as source", body, err, n1.IP)
	}

	// bridge-nf-call-iptables off: Services still work, from the pod to
	// every backend; backends see a node address instead of the pod's.
	for _, n := range c.Nodes {
		if _, err := n.Exec(t.Context(), "sh", "-c", "echo 0 > /proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil {
			t.Fatal(err)
		}
	}
	// The restart moved nothing (SIGTERM does not leave the cluster and
	// n1 was back within failure detection): n1 still runs a client.
	var client replica
	if _, err := eventually(30*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Workload == "client" && r.Node == "n1" && r.Phase == api.PhaseRunning && r.Ready {
				client = r
				return nil
			}
		}
		return fmt.Errorf("no ready client replica on n1")
	}); err != nil {
		t.Fatal(err)
	}
	_, sub, _ := net.ParseCIDR(n1.PodSubnet)
	gateway := sub.IP.To4()
	gateway[3]++ // the bridge address: n1's own address on the pod network
	seen := map[string]bool{}
	_, err = eventually(20*time.Second, func() error {
		body, err := n1.PodHTTPGet("default", client.Name, "http://"+vip+"/", 2*time.Second)
		if err != nil {
			return err
		}
		remote, _, _ := net.SplitHostPort(field(body, "remote"))
		if remote != n1.IP && remote != gateway.String() {
			return fmt.Errorf("backend %s saw %s, want a node address (%s or %s)", field(body, "podIP"), remote, n1.IP, gateway)
		}
		seen[field(body, "podIP")] = true
		if len(seen) < 3 {
			return fmt.Errorf("reached %d of 3 backends", len(seen))
		}
		return nil
	})
	if err != nil {
		t.Fatal("with bridge-nf-call-iptables off: ", err)
	}

	// Cut n3 off: its endpoint leaves n1's and n2's rules.
	all, _ := replicas(n1)
	var n3IP string
	for _, r := range all {
		if r.Workload == "web" && r.Node == "n3" {
			n3IP = r.PodIP
		}
	}
	cut := time.Now()
	if err := n3.CutOff(); err != nil {
		t.Fatal(err)
	}
	// Poll, every 100 ms, when n1 declares n3 dead and when n3's endpoint
	// has left the rules of n1 and n2: the rules must follow failure
	// detection within a second.
	var dead, gone time.Time
	_, err = eventually(60*time.Second, func() error {
		if dead.IsZero() {
			if out, err := n1.CLI("get", "nodes", "n3"); err == nil && strings.Contains(out, " dead ") {
				dead = time.Now()
			}
		}
		if gone.IsZero() {
			still := false
			for _, n := range []*harness.Node{n1, n2} {
				dest, err := n.ServiceDestinations(t.Context())
				if err != nil || len(dest) == 0 {
					still = true // no answer, or no endpoint at all: n1's and n2's own must be there
				}
				for d := range dest {
					if strings.HasPrefix(d, n3IP+":") {
						still = true
					}
				}
			}
			if !still {
				gone = time.Now()
			}
		}
		if dead.IsZero() || gone.IsZero() {
			return fmt.Errorf("n3 dead on n1: %v, endpoint gone from n1 and n2: %v", !dead.IsZero(), !gone.IsZero())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if lag := gone.Sub(dead); lag > 1500*time.Millisecond { // 1 s, plus the 100 ms polling and CLI time
		t.Fatalf("endpoint left the rules %v after n3 was declared dead, want within 1 s", lag)
	}
	t.Logf("n3 declared dead %v after the cut; its endpoint gone from n1 and n2 rules %v after that",
		dead.Sub(cut).Round(time.Millisecond), gone.Sub(dead).Round(time.Millisecond))
}

func udpManifest(message string) string {
	udp := harness.App{Name: "udp", Replicas: 1, Grace: harness.Seconds(1), Env: harness.Env("MESSAGE", message),
		Ports: []corev1.ContainerPort{{ContainerPort: 8080, Protocol: corev1.ProtocolUDP}}}
	port := harness.ServicePort(53, "8080")
	port.Protocol = corev1.ProtocolUDP
	return harness.Manifests(udp.Deployment(), udp.Service("udp", []corev1.ServicePort{port}))
}

// TestUDPServiceFollowsReplacedEndpoint: a client that keeps its UDP
// socket reaches the new endpoint after the old one is replaced (stale
// conntrack entries are deleted).
func TestUDPServiceFollowsReplacedEndpoint(t *testing.T) {
	n := echoNode(t)
	apply(t, n, udpManifest("one"))
	first, _ := waitRunning(t, n, "udp", 1, 20*time.Second)
	vip := clusterIP(t, n, "udp")
	conn, err := harness.DialIn(n.NetNS)(t.Context(), "udp", vip+":53")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func() string {
		conn.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := conn.Write([]byte("?")); err != nil {
			return ""
		}
		buf := make([]byte, 512)
		k, err := conn.Read(buf)
		if err != nil {
			return ""
		}
		return field(string(buf[:k]), "hostname")
	}
	if _, err := eventually(10*time.Second, func() error {
		if got := ask(); got != first[0].Name {
			return fmt.Errorf("UDP answer from %q, want %s", got, first[0].Name)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	apply(t, n, udpManifest("two")) // a new spec: the replica is replaced
	var second []replica
	_, err = eventually(20*time.Second, func() error {
		all, err := replicas(n)
		if err != nil {
			return err
		}
		second = nil
		for _, r := range all {
			if r.Workload == "udp" {
				second = append(second, r)
			}
		}
		if len(second) != 1 || second[0].Name == first[0].Name || second[0].Phase != api.PhaseRunning {
			return fmt.Errorf("replicas: %+v", second)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	took, err := eventually(10*time.Second, func() error {
		if got := ask(); got != second[0].Name {
			return fmt.Errorf("same socket answered by %q, want the new endpoint %s", got, second[0].Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("UDP client on the same socket reached the new endpoint %v after it ran", took.Round(time.Millisecond))
}

// TestReadinessDrivesEndpointsOnEveryNode: a replica whose readiness probe
// fails leaves every node's Service rules, and comes back when it passes.
func TestReadinessDrivesEndpointsOnEveryNode(t *testing.T) {
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	importEcho(t, n1)
	probed := harness.App{Name: "probed", Replicas: 2, Grace: harness.Seconds(1), Ports: harness.HTTPPort,
		Readiness: harness.HTTPProbe("/healthz", 1)}
	apply(t, n1, harness.Manifests(probed.Deployment(), probed.Service("probed", []corev1.ServicePort{harness.ServicePort(80, "http")})))
	var target replica
	inRules := func(want bool) error {
		for _, n := range []*harness.Node{n1, n2} {
			dest, err := n.ServiceDestinations(t.Context())
			if err != nil {
				return err
			}
			if has := dest[target.PodIP+":8080"]; has != want {
				return fmt.Errorf("%s: endpoint %s in rules = %v, want %v", n.Name, target.PodIP, has, want)
			}
		}
		return nil
	}
	_, err := eventually(60*time.Second, func() error {
		byNode, err := readyOnePerNode(n1, "probed", 2)
		if err != nil {
			return err
		}
		target = byNode[n1.Name]
		return inRules(true)
	})
	if err != nil {
		t.Fatal(err)
	}
	owner := n1
	if target.Node == n2.Name {
		owner = n2
	}
	if _, err := harness.HTTPGet(owner.NetNS, "http://"+target.PodIP+":8080/unready", time.Second); err != nil {
		t.Fatal(err)
	}
	took, err := eventually(15*time.Second, func() error { return inRules(false) })
	if err != nil {
		t.Fatal("failing readiness: ", err)
	}
	t.Logf("unready replica left both nodes' rules in %v", took.Round(time.Millisecond))
	if _, err := harness.HTTPGet(owner.NetNS, "http://"+target.PodIP+":8080/ready", time.Second); err != nil {
		t.Fatal(err)
	}
	took, err = eventually(15*time.Second, func() error { return inRules(true) })
	if err != nil {
		t.Fatal("passing readiness again: ", err)
	}
	t.Logf("ready again: back in both nodes' rules in %v", took.Round(time.Millisecond))
}

// readyOnePerNode returns workload's replicas by node once settled: want
// copies listed in all, each Running and ready, on want distinct nodes (a
// copy handed off from the first node to join is not one of them).
func readyOnePerNode(n *harness.Node, workload string, want int) (map[string]replica, error) {
	all, err := replicas(n)
	if err != nil {
		return nil, err
	}
	byNode, listed := map[string]replica{}, 0
	for _, r := range all {
		if r.Workload != workload {
			continue
		}
		listed++
		if r.Ready && r.Phase == api.PhaseRunning {
			byNode[r.Node] = r
		}
	}
	if listed != want || len(byNode) != want {
		return nil, fmt.Errorf("%s: %d listed, ready on %d nodes, want %d on %d", workload, listed, len(byNode), want, want)
	}
	return byNode, nil
}
