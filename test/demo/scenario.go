package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

const (
	namespace   = "default"
	replicas    = 6 // examples/hello/deployment.yaml
	maxUnavail  = 1 // its rollingUpdate.maxUnavailable
	maxSurge    = 1 // its rollingUpdate.maxSurge
	nodePort    = 30080
	requests    = 20 // per client, to the ClusterIP
	helloDir    = "examples/hello/"
	clientYAML  = "test/demo/client.yaml"
	kvDir       = "examples/kv/"
	kvPassword  = "change-me-7c41" // examples/kv/kv.yaml's Secret
	helloDeploy = "examples/hello/deployment.yaml"
)

// scenario is one run of the demo.
type scenario struct {
	dir, binary string
	debs        string // Debian packages (the key-value store's image)
	keep        bool
	// onCluster hands the cluster to the signal handler once it exists.
	onCluster func(*harness.Cluster)

	r                 *report
	c                 *harness.Cluster
	echoV1, echoV2    string // image tarballs
	client, redis     string
	vip               string // the hello Service's ClusterIP
	hello, clientReps []api.Replica
}

func (s *scenario) run() int {
	s.r = &report{out: quiet{os.Stdout}, start: time.Now()}
	mod, err := harness.ModuleDir()
	if err == nil {
		// Paths in the commands shown (examples/hello/) are then the ones run.
		err = os.Chdir(mod)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	fmt.Print(`==== Starling demo: a three-node cluster on this machine ====
Starling runs Kubernetes-style Deployments and Services on a cluster with no
master: every node runs the same agent, and any node answers for all of them.
This demo makes three "machines" out of network namespaces, each with its own
containerd and its own starling agent, joined by a LAN namespace
(` + harness.LANPrefix + `.0/24). Nothing touches this machine's own network.
`)
	ok := s.r.step("Build starling and the demo images", func() error { return s.build(mod) }) &&
		s.r.step("Start 3 nodes (own containerd and agent each): node1 creates the cluster, the others join with invitations (starling join-token NAME)", s.start) &&
		s.r.step("From the LAN, the CLI reaches node2's API over TLS, its certificate pinned (CA and node key)", s.tlsAPI) &&
		s.r.step("Import the images on node1 only", s.importImages) &&
		s.r.step("Apply examples/hello/ and 3 clients, spread over the 3 nodes", s.apply) &&
		s.r.step("node2 and node3 fetched the images from node1 (no registry)", s.imagesShared)
	if ok {
		s.r.say("")
		s.r.say(`Next, each client pod sends %d HTTP requests to the hello Service's
ClusterIP (%s:80). The requests leave from inside the client pod's network
namespace: its own address, routes and rules (there is no "exec" into pods
yet). Each answer names the replica that served it and the source address that
replica saw.`, requests, s.vip)
		for _, cl := range s.clientReps {
			s.r.step(fmt.Sprintf("ClusterIP from %s's client: same- and cross-node, client address kept", cl.Node),
				func() error { return s.clusterIPFrom(cl) })
		}
		s.r.step("Hairpin: a hello pod reaches its own Service and is served by itself", s.hairpin)
		s.r.step("Names: a pod finds the hello Service as \"hello\", answered by its own node's DNS", s.names)
		s.r.step(fmt.Sprintf("NodePort %d answers on every node, from the LAN", nodePort), s.nodePorts)
		s.r.step("Ingress: https://"+ingressHost+"/ through every node, its certificate from a Secret", s.ingressTLS)
		ok = s.r.step("Cut node3 off: its endpoints gone everywhere, its replicas run elsewhere", s.cutOff) &&
			s.r.step("Reconnect node3: it rejoins and takes its share back", s.reconnect) &&
			s.r.step("LoadBalancer: hello at a LAN address from the pool; its node cut off, the address moves", s.loadBalancer)
	}
	if ok {
		ok = s.r.step(fmt.Sprintf("Roll out v2: available never below %d - %d = %d, copies never above %d + %d", replicas, maxUnavail, replicas-maxUnavail, replicas, maxSurge), s.rollout) &&
			s.r.step("After the rollout, every answer comes from v2", s.afterRollout)
	}
	if ok {
		s.r.step("A key-value store with its config, password and data (examples/kv): its keys survive a rollout", s.keyValue)
	}
	passed := s.r.summary()
	if interrupted.Load() {
		return 130
	}
	if !passed && s.c != nil {
		diag := diagnosticsPath(s.dir)
		if err := writeDiagnostics(diag, s.c); err == nil {
			fmt.Println("agent logs, routes and iptables rules of every node:", diag)
		}
	}
	if s.keep && s.c != nil {
		s.usage()
	} else if s.c != nil {
		fmt.Println("removing the demo cluster ...")
		if err := s.c.Close(); err != nil {
			fmt.Println("clean-up:", err)
		}
	}
	if !passed {
		return 1
	}
	return 0
}

func (s *scenario) node(name string) *harness.Node {
	for _, n := range s.c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

func (s *scenario) build(mod string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var err error
	if s.binary == "" {
		s.binary, err = harness.BuildBinary(ctx, mod, s.dir)
	} else {
		s.binary, err = filepath.Abs(s.binary)
	}
	if err != nil {
		return err
	}
	s.r.binary = s.binary
	const busybox = "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		return fmt.Errorf("%s not found: install the Debian package busybox-static (make deps does)", busybox)
	}
	images := filepath.Join(s.dir, "images")
	if err := os.MkdirAll(images, 0o700); err != nil {
		return err
	}
	s.echoV1 = filepath.Join(images, "echo-v1.tar")
	s.echoV2 = filepath.Join(images, "echo-v2.tar")
	s.client = filepath.Join(images, "client-v1.tar")
	if err := imagebuild.Echo(ctx, mod, "starling.local/echo:v1", "v1", s.echoV1); err != nil {
		return err
	}
	if err := imagebuild.Echo(ctx, mod, "starling.local/echo:v2", "v2", s.echoV2); err != nil {
		return err
	}
	if err := imagebuild.Busybox("starling.local/client:v1", busybox, s.client); err != nil {
		return err
	}
	s.redis = filepath.Join(images, "redis-7.tar")
	if err := imagebuild.Redis(ctx, s.debs, "starling.local/redis:7", s.redis); err != nil {
		return err
	}
	rel, _ := filepath.Rel(mod, s.binary)
	if strings.HasPrefix(rel, "..") {
		rel = s.binary
	}
	s.r.say(`starling                  %s
starling.local/echo:v1    test/images/echo: a static Go HTTP server that answers with its
starling.local/echo:v2      name, pod IP, the client address it sees, and its version
starling.local/client:v1  Debian's static busybox (sh, wget), for client pods
starling.local/redis:7    Debian's redis-server, for examples/kv
Images are plain tarballs in %s: no registry anywhere.`, rel, images)
	return nil
}

func (s *scenario) start() error {
	c, err := harness.NewNamed(s.dir, prefix, s.binary, nil)
	if err != nil {
		return err
	}
	s.c = c
	s.onCluster(c)
	for i := 1; i <= 3; i++ {
		n, err := c.AddNode(fmt.Sprintf("node%d", i), i)
		if err != nil {
			return err
		}
		n.PodSubnet = "" // each node claims a free /24 of 10.22.0.0/16 by itself
	}
	s.r.seed = c.Nodes[0]
	if err := c.Nodes[0].StartAgent(); err != nil {
		return err
	}
	// The others join through node1 at the same time; if they claim the
	// same /24, the earlier claim wins and the other picks again.
	var wg sync.WaitGroup
	errs := make([]error, len(c.Nodes))
	for i, n := range c.Nodes[1:] {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = n.StartAgent() }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		s.r.say("%s  namespace %-14s LAN address %s  pod subnet %s (claimed by itself)", n.Name, n.NetNS, n.IP, n.PodSubnet)
	}
	err = poll(30*time.Second, func() error {
		items, err := c.Nodes[0].API().Nodes(context.Background())
		if err != nil {
			return err
		}
		alive := 0
		for _, m := range items {
			if m.State == "alive" && m.Ready {
				alive++
			}
		}
		if alive != 3 {
			return fmt.Errorf("node1 sees %d of 3 nodes alive and ready", alive)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.r.say("\nPlain `starling` below talks to node1's API socket (--server %s);\nany node answers for the whole cluster.", c.Nodes[0].Socket)
	_, err = s.r.run(c.Nodes[0], "get", "nodes")
	return err
}

// tlsAPI writes a client config on node2 (its TCP API address, the pins
// of the cluster CA and of node2's key, the API token) and uses it from
// the LAN namespace: the CLI speaks TLS and accepts only node2's
// certificate.
func (s *scenario) tlsAPI() error {
	n2 := s.c.Nodes[1]
	cfg := filepath.Join(s.dir, "client-config")
	if _, err := s.r.run(n2, "config", "-o", cfg); err != nil {
		return err
	}
	s.r.say("(the file holds server, caPin, serverPin and token; mode 0600)")
	s.r.say("$ starling --config %s get nodes    # from the LAN namespace", cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := harness.NetNSExec(ctx, s.c.LAN, s.binary, "--config", cfg, "get", "nodes")
	s.r.say("%s", strings.TrimRight(out, "\n"))
	if err != nil {
		return err
	}
	for _, n := range s.c.Nodes {
		if !strings.Contains(out, n.Name+" ") {
			return fmt.Errorf("node2's answer over TLS lacks %s", n.Name)
		}
	}
	return nil
}

func (s *scenario) importImages() error {
	n1 := s.c.Nodes[0]
	for _, tar := range []string{s.echoV1, s.echoV2, s.client, s.redis} {
		if _, err := s.r.run(n1, "image", "import", tar); err != nil {
			return err
		}
	}
	s.r.say("node2 and node3 get nothing: a node that needs an image fetches it from a peer.")
	return nil
}

// byNode counts the Running (and, with ready, ready) replicas of workload
// by node.
func byNode(items []api.Replica, workload string, ready bool) map[string]int {
	out := map[string]int{}
	for _, r := range items {
		if r.Workload == workload && r.Phase == api.PhaseRunning && (r.Ready || !ready) {
			out[r.Node]++
		}
	}
	return out
}

func fmtCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// endpointsEverywhere checks that every node's rules send to each of the
// given replicas' port 8080.
func (s *scenario) endpointsEverywhere(ctx context.Context, nodes []*harness.Node, reps []api.Replica) error {
	for _, n := range nodes {
		dest, err := n.ServiceDestinations(ctx)
		if err != nil {
			return err
		}
		for _, r := range reps {
			if !dest[r.PodIP+":8080"] {
				return fmt.Errorf("%s's rules lack endpoint %s (%s)", n.Name, r.PodIP, r.Name)
			}
		}
	}
	return nil
}

// settle waits until hello has 6 ready replicas and client 3 running,
// spread evenly over nodes, and every node's rules hold the hello
// endpoints; it sets s.hello and s.clientReps.
func (s *scenario) settle(nodes []*harness.Node, timeout time.Duration) error {
	ctx := context.Background()
	return poll(timeout, func() error {
		items, err := s.c.Nodes[0].Replicas()
		if err != nil {
			return err
		}
		h, cl := byNode(items, "hello", true), byNode(items, "client", false)
		for _, n := range nodes {
			if h[n.Name] != replicas/len(nodes) || cl[n.Name] != 3/len(nodes) {
				return fmt.Errorf("hello ready by node: %s; clients running by node: %s", fmtCounts(h), fmtCounts(cl))
			}
		}
		s.hello, s.clientReps = nil, nil
		for _, r := range items {
			if r.Phase == api.PhaseRunning && r.Workload == "hello" {
				s.hello = append(s.hello, r)
			}
			if r.Phase == api.PhaseRunning && r.Workload == "client" {
				s.clientReps = append(s.clientReps, r)
			}
		}
		if len(s.hello) != replicas || len(s.clientReps) != 3 {
			return fmt.Errorf("%d hello and %d client replicas listed", len(s.hello), len(s.clientReps))
		}
		slices.SortFunc(s.clientReps, func(a, b api.Replica) int { return strings.Compare(a.Node, b.Node) })
		// No copy left over anywhere (a moved replica's old copy stopping),
		// as each node sees its own containers.
		if cs := harness.TakeCensus(nodes, namespace, "hello"); !cs.Complete || cs.Existing != replicas || cs.Available != replicas {
			return fmt.Errorf("hello copies on the nodes: %s", strings.Join(cs.Copies, ", "))
		}
		if cs := harness.TakeCensus(nodes, namespace, "client"); !cs.Complete || cs.Existing != 3 {
			return fmt.Errorf("client copies on the nodes: %s", strings.Join(cs.Copies, ", "))
		}
		return s.endpointsEverywhere(ctx, nodes, s.hello)
	})
}

func (s *scenario) apply() error {
	n1 := s.c.Nodes[0]
	s.r.say(`examples/hello/ holds a Deployment "hello" of %d echo servers with a readiness
probe (GET /healthz every second), a ClusterIP Service "hello", a NodePort
Service "hello-nodeport" (port %d on every node), a LoadBalancer Service
"hello-lb" and an Ingress "hello". test/demo/client.yaml is a
Deployment "client" of 3 busybox pods that sleep.`, replicas, nodePort)
	start := time.Now()
	if _, err := s.r.run(n1, "apply", "-f", helloDir); err != nil {
		return err
	}
	if _, err := s.r.run(n1, "apply", "-f", clientYAML); err != nil {
		return err
	}
	s.r.say("Every node computes the same placement (rendezvous hashing): 2 hello and 1 client each.")
	if err := s.settle(s.c.Nodes, 120*time.Second); err != nil {
		return err
	}
	s.r.say("%d hello replicas ready, 3 clients running, and all 6 endpoints in every node's rules %s after apply.\n",
		replicas, round(time.Since(start)))
	if _, err := s.r.run(n1, "get", "replicas", "-o", "wide"); err != nil {
		return err
	}
	if _, err := s.r.run(n1, "get", "services"); err != nil {
		return err
	}
	js, err := n1.CLI("get", "services", "hello", "-o", "json")
	if err != nil {
		return err
	}
	var svc struct{ Spec struct{ ClusterIP string } }
	if err := json.Unmarshal([]byte(js), &svc); err != nil || net.ParseIP(svc.Spec.ClusterIP) == nil {
		return fmt.Errorf("service hello has no ClusterIP: %q %v", js, err)
	}
	s.vip = svc.Spec.ClusterIP
	return nil
}

func (s *scenario) imagesShared() error {
	want := []string{"starling.local/echo:v1", "starling.local/client:v1"}
	for _, n := range s.c.Nodes[1:] {
		var out string
		var err error
		if n == s.c.Nodes[len(s.c.Nodes)-1] {
			out, err = s.r.run(n, "image", "ls")
		} else {
			out, err = n.CLI("image", "ls")
		}
		if err != nil {
			return err
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				return fmt.Errorf("%s lacks %s:\n%s", n.Name, w, out)
			}
		}
	}
	s.r.say("node2 likewise. echo:v2 is not needed yet: it stays on node1 until the rollout.")
	return nil
}

// answer is what one echo reply says.
type answer struct {
	hostname, podIP, remoteIP, message string
}

func parseAnswer(body string) answer {
	var a answer
	for _, line := range strings.Split(body, "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "hostname":
			a.hostname = v
		case "podIP":
			a.podIP = v
		case "remote":
			a.remoteIP, _, _ = net.SplitHostPort(v)
		case "message":
			a.message = v
		}
	}
	return a
}

// nodeOf names the node that runs the hello replica called name.
func (s *scenario) nodeOf(name string) string {
	for _, r := range s.hello {
		if r.Name == name {
			return r.Node
		}
	}
	return "?"
}

// tally counts answers by the replica that served them.
type tally struct {
	order  []string
	count  map[string]int
	remote map[string]map[string]bool
	failed int
	first  error
}

func newTally() *tally {
	return &tally{count: map[string]int{}, remote: map[string]map[string]bool{}}
}

func (t *tally) add(a answer, err error) {
	if err != nil {
		t.failed++
		if t.first == nil {
			t.first = err
		}
		return
	}
	if t.count[a.hostname] == 0 {
		t.order = append(t.order, a.hostname)
		t.remote[a.hostname] = map[string]bool{}
	}
	t.count[a.hostname]++
	t.remote[a.hostname][a.remoteIP] = true
}

func (s *scenario) clusterIPFrom(cl api.Replica) error {
	n := s.node(cl.Node)
	url := "http://" + s.vip + "/"
	t := newTally()
	same, cross := false, false
	sent := 0
	// 20 requests; a few more if random balancing has not yet picked a
	// backend on the client's own node (2 of 6: (4/6)^20 = 0.03% of runs).
	for sent < requests || (!same && sent < 3*requests) {
		body, err := n.PodHTTPGet(namespace, cl.Name, url, 2*time.Second)
		sent++
		a := parseAnswer(body)
		t.add(a, err)
		if err == nil {
			same = same || s.nodeOf(a.hostname) == cl.Node
			cross = cross || s.nodeOf(a.hostname) != cl.Node
		}
	}
	extra := ""
	if sent > requests {
		extra = fmt.Sprintf(" (%d more until a same-node replica answered)", sent-requests)
	}
	s.r.say("%s on %s, pod address %s -> http://%s:80/, %d requests%s:", cl.Name, cl.Node, cl.PodIP, s.vip, sent, extra)
	s.r.say("  %-22s %-6s %-8s %s", "answered by", "on", "answers", "source address it saw")
	var problems []string
	slices.SortFunc(t.order, func(a, b string) int { return strings.Compare(s.nodeOf(a)+a, s.nodeOf(b)+b) })
	for _, h := range t.order {
		where := "cross-node"
		if s.nodeOf(h) == cl.Node {
			where = "same node"
		}
		remotes := slices.Sorted(maps.Keys(t.remote[h]))
		note := "the client's own address (kept)"
		if len(remotes) != 1 || remotes[0] != cl.PodIP {
			note = "NOT the client's address"
			problems = append(problems, fmt.Sprintf("%s saw %v, want %s", h, remotes, cl.PodIP))
		}
		s.r.say("  %-22s %-6s %-8d %s  %s, %s", h, s.nodeOf(h), t.count[h], strings.Join(remotes, ","), where, note)
	}
	if t.failed > 0 {
		problems = append(problems, fmt.Sprintf("%d of %d requests failed, first: %v", t.failed, sent, t.first))
	}
	if !same {
		problems = append(problems, "no replica on the client's node answered")
	}
	if !cross {
		problems = append(problems, "no replica on another node answered")
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// names has a hello pod resolve "hello" as any program in it does, and
// shows the same lookup through the CLI.
func (s *scenario) names() error {
	me := s.hello[0]
	n := s.node(me.Node)
	s.r.say(`%s asks for the name "hello", as any program in it would: its resolv.conf
names %s's own DNS (its pod subnet's gateway), the search path
%s.svc.cluster.local svc.cluster.local cluster.local and ndots:5. The node
answers from its own view of the cluster: no CoreDNS to run.`, me.Name, me.Node, namespace)
	body, err := n.PodHTTPGet(namespace, me.Name, "http://127.0.0.1:8080/resolve?name=hello", 12*time.Second)
	if err != nil {
		return fmt.Errorf("resolve hello in %s: %w", me.Name, err)
	}
	if got := strings.TrimSpace(body); got != s.vip {
		return fmt.Errorf("hello resolved to %q in %s, want the ClusterIP %s", got, me.Name, s.vip)
	}
	s.r.say("hello resolved to %s, the Service's ClusterIP. The same lookup from the CLI:", s.vip)
	out, err := n.CLI("dns", "lookup", "hello")
	if err != nil {
		return fmt.Errorf("starling dns lookup hello: %w", err)
	}
	s.r.say("$ starling dns lookup hello\n%s", strings.TrimSpace(out))
	return nil
}

func (s *scenario) hairpin() error {
	var me api.Replica
	for _, r := range s.hello {
		if r.Node == "node1" {
			me = r
			break
		}
	}
	n := s.node(me.Node)
	s.r.say(`%s (pod address %s, on %s) now requests the hello Service itself,
until the balancing picks it. Its own reply must come back through the node, so
Starling masquerades this one case ("hairpin"): the replica sees the node's
bridge address instead of its own.`, me.Name, me.PodIP, me.Node)
	for i := 1; i <= 100; i++ {
		body, err := n.PodHTTPGet(namespace, me.Name, "http://"+s.vip+"/", 2*time.Second)
		if err != nil {
			return fmt.Errorf("request %d from %s to its Service: %w", i, me.Name, err)
		}
		a := parseAnswer(body)
		if a.hostname != me.Name {
			continue
		}
		s.r.say("request %d was served by %s itself; it saw the request come from %s.", i, me.Name, a.remoteIP)
		if a.remoteIP == me.PodIP {
			return fmt.Errorf("the hairpin request arrived from the pod's own address %s: not masqueraded", me.PodIP)
		}
		return nil
	}
	return fmt.Errorf("100 requests from %s to its Service, none served by itself", me.Name)
}

func (s *scenario) nodePorts() error {
	s.r.say(`From the LAN namespace (%s.254, outside the cluster), 4 requests to port %d
of each node's LAN address. Any node forwards to a ready replica on any node. The
replica sees a node's address, masqueraded so replies return the same way: the
node's bridge address (10.22.x.1) when it runs the replica, else its LAN address.`, harness.LANPrefix, nodePort)
	var problems []string
	for _, n := range s.c.Nodes {
		url := fmt.Sprintf("http://%s:%d/", n.IP, nodePort)
		var who, seen []string
		for range 4 {
			body, err := harness.HTTPGet(s.c.LAN, url, 2*time.Second)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", url, err))
				continue
			}
			a := parseAnswer(body)
			who = append(who, fmt.Sprintf("%s (%s)", a.hostname, s.nodeOf(a.hostname)))
			if !slices.Contains(seen, a.remoteIP) {
				seen = append(seen, a.remoteIP)
			}
		}
		s.r.say("GET %s answered by %s\n  source addresses seen: %s", url, strings.Join(who, ", "), strings.Join(seen, ", "))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

func (s *scenario) cutOff() error {
	ctx := context.Background()
	n1, n2, n3 := s.c.Nodes[0], s.c.Nodes[1], s.c.Nodes[2]
	survivors := []*harness.Node{n1, n2}
	var gone []api.Replica
	for _, r := range s.hello {
		if r.Node == n3.Name {
			gone = append(gone, r)
		}
	}
	var ips []string
	for _, r := range gone {
		ips = append(ips, r.PodIP)
	}
	s.r.say(`node3 now fails as a pulled cable or a crash would: its LAN link goes down and
its agent and containers are killed. Its %d hello replicas (%s) must leave
the Service rules of node1 and node2, and be replaced on them. Polled every 100 ms:`,
		len(gone), strings.Join(ips, ", "))
	start := time.Now()
	if err := n3.CutOff(); err != nil {
		return err
	}
	var dead, replaced time.Duration
	left := map[string]time.Duration{}
	err := poll(90*time.Second, func() error {
		if dead == 0 {
			if items, err := n1.API().Nodes(context.Background()); err == nil {
				for _, m := range items {
					if m.Name == n3.Name && m.State == "dead" {
						dead = time.Since(start)
					}
				}
			}
		}
		for _, n := range survivors {
			if _, ok := left[n.Name]; ok {
				continue
			}
			dest, err := n.ServiceDestinations(ctx)
			if err != nil {
				continue
			}
			still := false
			for _, r := range gone {
				still = still || dest[r.PodIP+":8080"]
			}
			if !still {
				left[n.Name] = time.Since(start)
			}
		}
		if replaced == 0 {
			cs := harness.TakeCensus(survivors, namespace, "hello")
			if cs.Complete && cs.Available == replicas {
				replaced = time.Since(start)
			}
		}
		if dead == 0 || len(left) < len(survivors) || replaced == 0 {
			return fmt.Errorf("node3 dead on node1: %v; endpoints gone from %d of 2 nodes; %d ready on node1+node2",
				dead > 0, len(left), harness.TakeCensus(survivors, namespace, "hello").Available)
		}
		return nil
	})
	type event struct {
		at   time.Duration
		what string
	}
	events := []event{{0, "node3 cut off"}}
	if dead > 0 {
		events = append(events, event{dead, "node1 declares node3 dead (failure detection: probes, then suspicion)"})
	}
	for _, n := range survivors {
		if at, ok := left[n.Name]; ok {
			events = append(events, event{at, fmt.Sprintf("node3's endpoints gone from %s's rules", n.Name)})
		}
	}
	if replaced > 0 {
		events = append(events, event{replaced, fmt.Sprintf("%d hello replicas ready again, all on node1 and node2", replicas)})
	}
	slices.SortStableFunc(events, func(a, b event) int { return int(a.at - b.at) })
	for _, e := range events {
		s.r.say("  +%-7s %s", round(e.at), e.what)
	}
	if err != nil {
		return err
	}
	if _, err := s.r.run(n1, "get", "nodes"); err != nil {
		return err
	}
	if _, err := s.r.run(n1, "get", "replicas", "hello", "-o", "wide"); err != nil {
		return err
	}
	// Traffic now reaches only live replicas.
	items, err := n1.Replicas()
	if err != nil {
		return err
	}
	s.hello = nil
	for _, r := range items {
		if r.Workload == "hello" && r.Phase == api.PhaseRunning {
			s.hello = append(s.hello, r)
		}
	}
	var cl api.Replica
	for _, r := range items {
		if r.Workload == "client" && r.Node == n1.Name && r.Phase == api.PhaseRunning {
			cl = r
		}
	}
	t := newTally()
	for range requests {
		body, err := n1.PodHTTPGet(namespace, cl.Name, "http://"+s.vip+"/", 2*time.Second)
		t.add(parseAnswer(body), err)
	}
	nodes := map[string]int{}
	for h, k := range t.count {
		nodes[s.nodeOf(h)] += k
	}
	s.r.say("%d requests from %s to the ClusterIP now: %d answered (by node: %s), %d failed.",
		requests, cl.Name, requests-t.failed, fmtCounts(nodes), t.failed)
	if t.failed > 0 || nodes[n3.Name] > 0 {
		return fmt.Errorf("after the cut: %d requests failed (first: %v), %d answered by node3", t.failed, t.first, nodes[n3.Name])
	}
	return nil
}

func (s *scenario) reconnect() error {
	n3 := s.c.Nodes[2]
	s.r.say("node3's link comes back up and its agent restarts (as after a reboot). It\nrejoins through the peers it knew and takes 2 hello and 1 client back; the\nreplicas it takes over keep running elsewhere until its own are ready\n(make-before-break).")
	start := time.Now()
	if err := n3.Reconnect(); err != nil {
		return err
	}
	err := poll(180*time.Second, func() error {
		if err := s.settle(s.c.Nodes, 0); err != nil {
			return err
		}
		// Exactly 9 containers left: the copies it took back are gone
		// from node1 and node2.
		total := 0
		for _, n := range s.c.Nodes {
			total += n.RunningContainers()
		}
		if total != replicas+3 {
			return fmt.Errorf("%d containers running across nodes, want %d", total, replicas+3)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.r.say("Back to 2 hello and 1 client per node, %d containers in all, %s after the reconnect.", replicas+3, round(time.Since(start)))
	_, err = s.r.run(s.c.Nodes[0], "get", "nodes")
	return err
}

func (s *scenario) rollout() error {
	n1 := s.c.Nodes[0]
	manifest, err := os.ReadFile(helloDeploy)
	if err != nil {
		return err
	}
	v2 := strings.ReplaceAll(string(manifest), "starling.local/echo:v1", "starling.local/echo:v2")
	if v2 == string(manifest) {
		return fmt.Errorf("%s does not name starling.local/echo:v1", helloDeploy)
	}
	s.r.say(`A new version: the same Deployment with image starling.local/echo:v2 (node2
and node3 fetch it from node1 now). The rolling update replaces one replica at a
time, waiting for each new one to be ready, with at most %d unavailable and %d
extra. Meanwhile the demo asks every node, every 100 ms, which hello copies it
runs and which are ready, and the client on node1 keeps requesting the ClusterIP
(a replica being replaced first leaves every node's Service rules and gets
SIGTERM only a second later, the agent's --drain-delay, so no request should
fail).`, maxUnavail, maxSurge)
	sampler := harness.Sample(s.c.Nodes, namespace, "hello", 100*time.Millisecond)
	cl := s.clientReps[0]
	stop := make(chan struct{})
	var traffic sync.WaitGroup
	versions := map[string]int{}
	failed := 0
	var firstErr error
	traffic.Add(1)
	go func() {
		defer traffic.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			body, err := s.node(cl.Node).PodHTTPGet(namespace, cl.Name, "http://"+s.vip+"/", 2*time.Second)
			if err != nil {
				failed++
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			versions[parseAnswer(body).message]++
		}
	}()
	start := time.Now()
	_, err = s.r.runInput(n1, strings.NewReader(v2), "sed s/echo:v1/echo:v2/ "+helloDeploy, "apply", "-f", "-")
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		_, err = s.r.stream(ctx, n1, "rollout", "status", "deployment/hello", "--timeout", "4m")
		cancel()
	}
	// rollout status reports done as node1 sees the cluster; the census
	// confirms from each node's own containers before sampling stops.
	if err == nil {
		err = poll(30*time.Second, func() error {
			cs := harness.TakeCensus(s.c.Nodes, namespace, "hello")
			if len(cs.ByHash) != 1 || cs.Existing != replicas || cs.Available != replicas {
				return fmt.Errorf("copies by spec hash %v, %d available", cs.ByHash, cs.Available)
			}
			return nil
		})
	}
	took := time.Since(start)
	sampler.Stop()
	close(stop)
	traffic.Wait()
	if err != nil {
		return err
	}
	var seen []string
	for _, k := range slices.Sorted(maps.Keys(sampler.AvailableSeen)) {
		seen = append(seen, fmt.Sprintf("%d available in %d", k, sampler.AvailableSeen[k]))
	}
	s.r.say(`Rolled out in %s; %d samples of all 3 nodes: %s.
Fewest available: %d (budget: at least %d). Most copies at once: %d (budget: at most %d).`,
		round(took), sampler.Samples, strings.Join(seen, ", "), sampler.MinAvailable, replicas-maxUnavail,
		sampler.MaxExisting, replicas+maxSurge)
	if sampler.MinAvailable == replicas {
		s.r.say("(With a surge of 1, each new copy was ready before its old one stopped.)")
	}
	s.r.say("The client sent %d requests meanwhile: %d answered by v1, %d by v2, %d failed.",
		versions["v1"]+versions["v2"]+failed, versions["v1"], versions["v2"], failed)
	if firstErr != nil {
		s.r.say("first failed request: %v", firstErr)
	}
	if sampler.Samples < 10 {
		return fmt.Errorf("only %d complete samples", sampler.Samples)
	}
	if failed > 0 {
		return fmt.Errorf("%d requests to the ClusterIP failed during the rollout, first: %v", failed, firstErr)
	}
	if sampler.MinAvailable < replicas-maxUnavail || sampler.MaxExisting > replicas+maxSurge {
		s.r.say("the sample with the fewest available:\n  %s", strings.Join(sampler.Fewest.Copies, "\n  "))
		s.r.say("the sample with the most copies:\n  %s", strings.Join(sampler.Most.Copies, "\n  "))
		return fmt.Errorf("budget broken: %d available at the fewest (want >= %d), %d copies at the most (want <= %d)",
			sampler.MinAvailable, replicas-maxUnavail, sampler.MaxExisting, replicas+maxSurge)
	}
	return nil
}

func (s *scenario) afterRollout() error {
	n1 := s.c.Nodes[0]
	if _, err := s.r.run(n1, "get", "deployments"); err != nil {
		return err
	}
	var problems []string
	var lines []string
	for _, cl := range s.clientReps {
		n := s.node(cl.Node)
		t := newTally()
		versions := map[string]int{}
		for range requests {
			body, err := n.PodHTTPGet(namespace, cl.Name, "http://"+s.vip+"/", 2*time.Second)
			a := parseAnswer(body)
			t.add(a, err)
			if err == nil {
				versions[a.message]++
			}
		}
		lines = append(lines, fmt.Sprintf("%s on %s: %d requests, %d answered by v2, by %d different replicas",
			cl.Name, cl.Node, requests, versions["v2"], len(t.count)))
		if t.failed > 0 || versions["v2"] != requests {
			problems = append(problems, fmt.Sprintf("from %s: %d failed, answers by version %v", cl.Node, t.failed, versions))
		}
	}
	s.r.say("%s", strings.Join(lines, "\n"))
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// keyValue applies examples/kv (Redis with a ConfigMap, a Secret and a
// claim), stores a key, rolls the Deployment and reads the key back from
// the new replica, on the same node.
func (s *scenario) keyValue() error {
	n1 := s.c.Nodes[0]
	s.r.say(`examples/kv/kv.yaml: Redis with its redis.conf from a ConfigMap, its password
from a Secret and its data on a PersistentVolumeClaim, one command:`)
	if _, err := s.r.run(n1, "apply", "-f", kvDir); err != nil {
		return err
	}
	first, err := s.waitReady("kv", "", 90*time.Second)
	if err != nil {
		return err
	}
	n := s.node(first.Node)
	auth := "AUTH " + kvPassword
	replies, err := n.PodRedis(namespace, first.Name, first.PodIP+":6379", 5*time.Second, auth, "SET greeting hello-from-"+first.Name, "GET greeting")
	if err != nil {
		return err
	}
	s.r.say("On %s (%s): AUTH, SET greeting, GET greeting: %s", first.Name, first.Node, strings.Join(replies, ", "))
	if _, err := s.r.run(n1, "get", "pvc"); err != nil {
		return err
	}
	if _, err := s.r.run(n1, "rollout", "restart", "deployment/kv"); err != nil {
		return err
	}
	next, err := s.waitReady("kv", first.Name, 90*time.Second)
	if err != nil {
		return err
	}
	replies, err = s.node(next.Node).PodRedis(namespace, next.Name, next.PodIP+":6379", 5*time.Second, auth, "GET greeting")
	if err != nil {
		return err
	}
	s.r.say("The new replica %s (on %s, strategy Recreate: the old one stopped first) reads: %s", next.Name, next.Node, replies[1])
	if next.Node != first.Node || replies[1] != "hello-from-"+first.Name {
		return fmt.Errorf("after the rollout %s on %s reads %q, want %q on %s", next.Name, next.Node, replies[1], "hello-from-"+first.Name, first.Node)
	}
	return nil
}

// waitReady waits for a ready replica of workload other than not.
func (s *scenario) waitReady(workload, not string, timeout time.Duration) (api.Replica, error) {
	var found api.Replica
	_, err := harness.Poll(context.Background(), 200*time.Millisecond, timeout, func() error {
		items, err := s.c.Nodes[0].API().Replicas(context.Background())
		if err != nil {
			return err
		}
		for _, r := range items {
			if r.Workload == workload && r.Name != not && r.Ready {
				found = r
				return nil
			}
		}
		return fmt.Errorf("no ready replica of %s yet: %+v", workload, items)
	})
	return found, err
}

func (s *scenario) usage() {
	n1 := s.c.Nodes[0]
	var clients []string
	for _, cl := range s.clientReps {
		clients = append(clients, cl.Name)
	}
	fmt.Printf(`
The cluster is still running (KEEP=1). Try:
  export STARLING_SERVER=%s
  %s get replicas -o wide
  %s describe deployment hello
  %s rollout history deployment/hello
  %s logs <replica name>            # from any node, proxied to the replica's node
  %s describe ingress hello         # its backends' endpoints and its certificate
  %s get services                   # hello-lb's EXTERNAL-IP, from the pool (cluster lb-pool)
  %s dns lookup hello               # as a pod resolves it
The other nodes' sockets: %s, %s
The agents' logs: %s/nodeN/agent.log
From the LAN, over TLS with node2's client config (CA and node key pinned, token inside):
  nsenter --net=/run/netns/%s %s --config %s get nodes
A NodePort from the LAN namespace, and the Ingress (the demo CA in %s):
  nsenter --net=/run/netns/%s busybox wget -qO- http://%s:%d/
  nsenter --net=/run/netns/%s curl --cacert %s --resolve hello.example.test:443:%s https://hello.example.test/
wget from inside a client pod's network namespace (%s ...):
  nsenter --net=%s/netns/%s_%s busybox wget -qO- http://%s/
Remove everything with: make demo-down
`, n1.Socket, s.binary, s.binary, s.binary, s.binary, s.binary, s.binary, s.binary, s.c.Nodes[1].Socket, s.c.Nodes[2].Socket, s.dir,
		s.c.LAN, s.binary, filepath.Join(s.dir, "client-config"),
		filepath.Join(s.dir, "demo-ca.crt"), s.c.LAN, n1.IP, nodePort, s.c.LAN, filepath.Join(s.dir, "demo-ca.crt"), n1.IP, strings.Join(clients, ", "), s.node(s.clientReps[0].Node).DataDir, namespace, s.clientReps[0].Name, s.vip)
}
