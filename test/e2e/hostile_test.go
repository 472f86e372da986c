package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// TestHostilePeerChangesNothing: a program that holds a join token joins
// from its own namespace (so it holds what every node holds: the gossip
// key, the CA key, a certificate) and writes what the attacks of issue 10 wrote
// (test/hostile): a podIP carrying iptables-restore lines, a foreign
// podIP, a subnet claim of 8.8.8.0/24 and a backdated one of n2's /24, another node's status (as itself,
// and forged under that node's name with its own key), an invalid
// Service, a Deployment stamped two hours ahead and an unsigned one. The
// honest nodes' nat
// and filter rules and routes stay as they were, nothing of it is stored,
// a WARN names the writer and the reason, and
// starling_rejected_records_total counts each reason.
func TestHostilePeerChangesNothing(t *testing.T) {
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	honest := []*harness.Node{n1, n2}
	// Settled: each node routes to the other's subnet and has its
	// Service chains in place.
	before := map[string]string{}
	waitFor(t, 30*time.Second, func() error {
		for i, n := range honest {
			dp := dataplane(t, n)
			other := honest[1-i]
			// The Service rules are in place: both iptables tables'
			// canaries (a first sync can be seen between the two), or
			// the nftables table with its forward accept rules.
			inPlace := strings.Count(dp, "STARLING-CANARY -j RETURN") == 2
			if n.ProxyMode() == "nftables" {
				inPlace = strings.Contains(dp, "vmap @service-ips") && strings.Contains(dp, "STARLING-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
			}
			if !strings.Contains(dp, other.PodSubnet+" via "+other.IP) || !inPlace {
				return fmt.Errorf("%s has not settled:\n%s", n.Name, dp)
			}
			before[n.Name] = dp
		}
		return nil
	})
	// The operator invited three more hostile nodes, and (as a CA key
	// holder gone bad would) n2 once more with another key: their status
	// records pass the certificate check, so the checks behind it are
	// what refuses them.
	var invitations []string
	for _, name := range []string{"evil-b", "evil-c", "evil-d", n2.Name} {
		f, err := c.JoinToken(name)
		if err != nil {
			t.Fatal(err)
		}
		invitations = append(invitations, f)
	}
	_, out := startHostile(t, c, "evil", 9, "--victim", n2.Name, "--victim-subnet", n2.PodSubnet, "--invitations", strings.Join(invitations, ","))

	want := []string{"subnet", "subnet-taken", "pod-ip", "origin", "object", "clock", "identity", "unsigned"}
	waitFor(t, 30*time.Second, func() error {
		for _, n := range honest {
			m, err := metrics(n)
			if err != nil {
				return err
			}
			for _, reason := range want {
				if m[`starling_rejected_records_total{reason="`+reason+`"}`] < 1 {
					return fmt.Errorf("%s has not counted a %s refusal yet (hostile: %s)", n.Name, reason, out)
				}
			}
		}
		return nil
	})
	time.Sleep(5 * time.Second) // the hostile peer rewrites every 3 s; honest nodes sync every second
	for _, n := range honest {
		if got := dataplane(t, n); got != before[n.Name] {
			t.Errorf("%s's rules or routes changed:\nbefore:\n%s\nafter:\n%s", n.Name, before[n.Name], got)
		}
		log, err := os.ReadFile(n.AgentLogPath())
		if err != nil {
			t.Fatal(err)
		}
		for _, reason := range want {
			if !strings.Contains(string(log), "refused a record from a peer") || !strings.Contains(string(log), "reason="+reason) {
				t.Errorf("%s logged no WARN for reason %s", n.Name, reason)
			}
		}
		if strings.Count(string(log), "reason=subnet ") != 1 {
			t.Errorf("%s logged the subnet refusal %d times, want once", n.Name, strings.Count(string(log), "reason=subnet "))
		}
	}
	// Nothing hostile was stored: no Service x, no Deployment future, and
	// n2's own status is n2's.
	if s, err := n1.CLI("get", "deployments"); err != nil || strings.Contains(s, "future") || strings.Contains(s, "unsigned") {
		t.Errorf("get deployments: %q %v", s, err)
	}
	if s, err := n1.CLI("get", "services"); err != nil || strings.Contains(s, "x") && strings.Contains(s, "INPUT") {
		t.Errorf("get services: %q %v", s, err)
	}
	nodes, err := n1.CLI("get", "nodes")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(nodes, "\n") {
		if strings.HasPrefix(line, "n2 ") && !strings.Contains(line, n2.PodSubnet) {
			t.Errorf("n2's status was overwritten: %q", line)
		}
		if strings.Contains(line, "8.8.8.0") || strings.Contains(line, "10.22.99.") {
			t.Errorf("a hostile claim is listed: %q", line)
		}
	}
}

// startHostile adds node name (LAN address index i) and runs test/hostile
// in its namespace with a fresh join token, a data dir of its own and
// args; the returned writer collects its output. It is stopped at cleanup.
func startHostile(t *testing.T, c *harness.Cluster, name string, i int, args ...string) (*harness.Node, *syncWriter) {
	t.Helper()
	n, err := c.AddNode(name, i)
	if err != nil {
		t.Fatal(err)
	}
	tokenFile, err := c.JoinToken(name)
	if err != nil {
		t.Fatal(err)
	}
	return n, nsenter(t, "", append([]string{"--net=/run/netns/" + n.NetNS, hostile,
		"--name", name, "--bind", n.IP, "--token-file", tokenFile, "--data-dir", filepath.Join(n.Dir, "hostile"), "--join", c.Nodes[0].IP}, args...)...)
}

// dataplane returns what a node programmed: its nat and filter rules
// (counters stripped), its nftables table in nftables mode, and its
// routes.
func dataplane(t *testing.T, n *harness.Node) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	for _, table := range []string{"nat", "filter"} {
		s, err := n.Exec(ctx, "iptables-save", "-t", table)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(s, "\n") {
			if strings.HasPrefix(line, "#") || strings.HasPrefix(line, ":") {
				continue
			}
			b.WriteString(line + "\n")
		}
	}
	if n.ProxyMode() == "nftables" {
		s, err := n.Exec(ctx, "nft", "list", "table", "ip", "starling")
		if err != nil {
			s = "no table ip starling: " + err.Error() + "\n" // not written yet
		}
		b.WriteString(s)
	}
	routes, err := n.Exec(ctx, "ip", "route")
	if err != nil {
		t.Fatal(err)
	}
	b.WriteString(routes)
	return b.String()
}

// metrics reads a node's /metrics over its unix socket: sample name with
// labels -> value.
func metrics(n *harness.Node) (map[string]float64, error) {
	text, err := n.API().Metrics(context.Background())
	if err != nil {
		return nil, err
	}
	return parseMetrics(strings.NewReader(text))
}

func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

func waitFor(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	if _, err := eventually(timeout, f); err != nil {
		t.Fatalf("after %s: %v", timeout, err)
	}
}

// TestSharedImagesAreVerifiedAndPeersNeverGetTheToken: a node that holds
// a join token joins with a well-formed status that advertises an API
// and a replica (test/hostile --fake-api) and serves image blobs: the
// true manifest and config of echo:v1 (which it could read anywhere) and,
// for the layer and any other digest, other content. Honest nodes ask it
// for images and proxy logs to it, as to any node, over mutual TLS with
// their node certificates (the operator's API token never reaches it),
// and they take from a peer only content of the digests asked for, down
// from the manifest recorded when the image was imported: the poisoned
// layer is refused, no image is created, and once an honest copy is
// available the replicas run it.
func TestSharedImagesAreVerifiedAndPeersNeverGetTheToken(t *testing.T) {
	t.Parallel() // long and mostly waiting: runs beside another such test
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	// echo:v1 is recorded (imported on n1); the spy gets its manifest and
	// config, then n1's copy is removed behind the agent's back, so no
	// honest node has it.
	importEcho(t, n1)
	recorded := imageDigest(t, n1, "starling.local/echo:v1")
	ctrCtx, ctrCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ctrCancel()
	ctr := func(args ...string) string {
		t.Helper()
		o, err := n1.Exec(ctrCtx, "ctr", append([]string{"--address", n1.ContainerdSocket(), "-n", "starling"}, args...)...)
		if err != nil {
			t.Fatalf("ctr %v: %v %s", args, err, o)
		}
		return o
	}
	blobs := t.TempDir()
	manifestJSON := ctr("content", "get", recorded)
	var m struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	if err := json.Unmarshal([]byte(manifestJSON), &m); err != nil || len(m.Layers) == 0 {
		t.Fatalf("manifest of echo:v1: %v %q", err, manifestJSON)
	}
	for d, b := range map[string]string{recorded: manifestJSON, m.Config.Digest: ctr("content", "get", m.Config.Digest)} {
		if err := os.WriteFile(filepath.Join(blobs, d), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, out := startHostile(t, c, "spy", 8, "--fake-api", "--serve-blobs", blobs, "--poison", echoV2Tar)
	waitFor(t, 30*time.Second, func() error {
		s, err := n1.CLI("get", "nodes")
		if err != nil || !strings.Contains(s, "spy ") || !strings.Contains(s, "10.22.50.0/24") {
			return fmt.Errorf("spy not listed with its subnet: %q %v (spy: %s)", s, err, out)
		}
		return nil
	})
	ctr("images", "rm", "--sync", "starling.local/echo:v1")
	// And its blobs: a node pulls only the blobs it lacks, so a layer
	// left in n1's content store would make n1's pull from the spy
	// succeed with the genuine layer.
	n1.Exec(ctrCtx, "ctr", "--address", n1.ContainerdSocket(), "-n", "starling", "content", "rm", m.Layers[0].Digest, m.Config.Digest, recorded)
	// Deployment needs-image, of pods labelled app=ni.
	apply(t, n1, harness.App{Name: "ni", Replicas: 3, Container: "c", Ports: harness.Port8080}.Deployment(func(d *appsv1.Deployment) {
		d.Name = "needs-image"
	}))
	n1.CLI("logs", "ghost-0") // proxied to spy, which says it runs ghost-0
	waitFor(t, 60*time.Second, func() error {
		s := out.String()
		// The manifest and config passed; the layer is what it poisoned.
		if !strings.Contains(s, "request GET /v1/images/blobs/"+recorded) || !strings.Contains(s, "request GET /v1/images/blobs/"+m.Layers[0].Digest) ||
			!strings.Contains(s, "request GET /v1/logs/default/ghost-0") {
			return fmt.Errorf("spy has not been asked for the image's manifest and layer and for logs yet:\n%s", s)
		}
		for _, n := range []*harness.Node{n1, n2} {
			log, _ := os.ReadFile(n.AgentLogPath())
			if !strings.Contains(string(log), "image from peer refused") || !strings.Contains(string(log), "peer=spy") {
				return fmt.Errorf("%s has not refused spy's layer yet", n.Name)
			}
		}
		return nil
	})
	s := out.String()
	if strings.Contains(s, c.Token) || strings.Contains(s, "Bearer") {
		t.Fatalf("a peer request carried the operator's token:\n%s", s)
	}
	// Nodes call each other over mutual TLS with their node certificates
	// and send no Authorization header at all.
	if strings.Contains(s, `auth="Starling-Node `) || !strings.Contains(s, `auth="" client="n`) {
		t.Fatalf("peer requests do not come over mutual TLS from a node:\n%s", s)
	}
	for _, n := range []*harness.Node{n1, n2} {
		images, err := n.CLI("image", "ls")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(images, "echo:v1") {
			t.Fatalf("%s holds an image made of the poisoned content:\n%s", n.Name, images)
		}
	}
	// An honest copy again: the replicas on n2 get the recorded content.
	importEcho(t, n1)
	waitFor(t, 90*time.Second, func() error {
		if d := imageDigestOrEmpty(n2, "starling.local/echo:v1"); d != recorded {
			return fmt.Errorf("n2 holds echo:v1 at %q, want %s", d, recorded)
		}
		return nil
	})
}

func imageDigest(t *testing.T, n *harness.Node, ref string) string {
	t.Helper()
	d := imageDigestOrEmpty(n, ref)
	if d == "" {
		t.Fatalf("%s has no image %s", n.Name, ref)
	}
	return d
}

func imageDigestOrEmpty(n *harness.Node, ref string) string {
	items, err := n.API().Images(context.Background())
	if err != nil {
		return ""
	}
	for _, i := range items {
		if i.Name == ref {
			return i.Digest
		}
	}
	return ""
}

// syncWriter is a strings.Builder safe for a process's stdout and stderr
// and the test reading it.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestForgottenNodeCannotComeBackWithItsOldKey: 'starling node forget'
// frees a stopped node's name, revokes its key and voids earlier
// invitations for it. The node restarted with its old data dir (its old
// key and certificate) gets no new gossip key from the others and never
// becomes ready there; it logs that it was forgotten, starts nothing and
// stops the replicas it still ran after --fence-timeout; with a new
// identity it cannot join with an invitation made before the forget; with
// a new invitation it joins again under the same name.
func TestForgottenNodeCannotComeBackWithItsOldKey(t *testing.T) {
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	waitReadyNodes(t, n1, 2)
	// An invitation for n2 made well before the forget (an operator's spare,
	// or a copy of the one it joined with): the forget voids it.
	oldFile, err := c.JoinToken("n2")
	if err != nil {
		t.Fatal(err)
	}
	madeOld := time.Now()
	// Replicas on both nodes: n2's keep running across its clean stop.
	importEcho(t, n1)
	apply(t, n1, deployment("forgot", 4, "f"))
	waitRunning(t, n1, "forgot", 4, 90*time.Second)
	ran := n2.RunningContainers()
	if ran == 0 {
		t.Fatal("no replica runs on n2")
	}
	time.Sleep(time.Until(madeOld.Add(6 * time.Second))) // past the 5 s allowed for clocks
	n2.KillAgent(syscall.SIGTERM)                        // a clean stop; forget waits for failure detection
	var forgot string
	waitFor(t, 30*time.Second, func() error {
		out, err := n1.CLI("node", "forget", "n2")
		if err != nil {
			return fmt.Errorf("node forget n2: %v %s", err, out)
		}
		forgot = out
		return nil
	})
	if !strings.Contains(forgot, "its key") || !strings.Contains(forgot, "is revoked") || !strings.Contains(forgot, "gossip key rotated to") ||
		!strings.Contains(forgot, "skipped, no certified identity (forgotten, or not a node): n2") {
		t.Fatalf("node forget n2 did not revoke and rotate:\n%s", forgot)
	}
	t.Logf("node forget n2:\n%s", forgot)
	// The forgotten node kept its data dir: the old gossip key, the CA
	// certificate and its own key (no CA key: it joined with an
	// invitation). It mints itself a new identity with what it has and
	// tries to get back in.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+n2.NetNS, hostile,
		"--forgotten", n2.DataDir, "--name", "n2-reborn", "--bind", n2.IP, "--join", n1.IP).CombinedOutput()
	if err != nil {
		t.Fatalf("hostile --forgotten: %v\n%s", err, out)
	}
	t.Logf("the forgotten node with a minted identity:\n%s", out)
	if !strings.Contains(string(out), "gossip keys with the minted certificate: ") || strings.Contains(string(out), "gossip keys with the minted certificate: GIVEN") ||
		!strings.Contains(string(out), "gossip join with the kept keys: refused") {
		t.Fatalf("a minted identity got the gossip keys or into gossip:\n%s", out)
	}
	if nodes, _ := n1.CLI("get", "nodes"); strings.Contains(nodes, "n2-reborn") {
		t.Fatalf("the minted identity is listed:\n%s", nodes)
	}
	if err := n2.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	// Restarted with its old data dir it cannot read gossip (the key was
	// rotated) and no peer gives its revoked key the new one: it says it
	// was forgotten, starts nothing (sampled every 0.2 s) and stops the
	// replicas it still ran after --fence-timeout (3 s).
	most, stopped := 0, time.Duration(0)
	start := time.Now()
	waitFor(t, 60*time.Second, func() error {
		for {
			most = max(most, n2.RunningContainers())
			log, _ := os.ReadFile(n2.AgentLogPath())
			if strings.Contains(string(log), "this node was forgotten: 'starling node forget n2' revoked its key") && n2.RunningContainers() == 0 {
				stopped = time.Since(start)
				return nil
			}
			if time.Since(start) > 55*time.Second {
				return fmt.Errorf("n2 has not said it was forgotten and stopped its %d replicas:\n%s", n2.RunningContainers(), n2.Tail(20))
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	if most > ran {
		t.Fatalf("the forgotten n2 ran %d containers, more than the %d it had", most, ran)
	}
	t.Logf("the forgotten n2 stopped its %d replicas %s after its restart", ran, stopped.Round(100*time.Millisecond))
	time.Sleep(5 * time.Second) // and starts none
	if got := n2.RunningContainers(); got != 0 {
		t.Fatalf("the forgotten n2 runs %d containers", got)
	}
	waitRunning(t, n1, "forgot", 4, 30*time.Second)
	time.Sleep(3 * time.Second)
	if out, _ := n1.CLI("get", "nodes", "-o", "json"); strings.Contains(out, n2.PodSubnet) {
		t.Fatalf("n1 took the forgotten node's record back:\n%s", out)
	}
	// A new identity (the node's key and credentials removed) with an
	// invitation made before the forget: refused at join.
	n2.KillAgent(syscall.SIGTERM)
	for _, f := range []string{"node.key", "node.crt", "ca.crt", "gossip.key"} {
		if err := os.Remove(filepath.Join(n2.DataDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	err = n2.StartAgent("--join-token-file", oldFile)
	if err == nil || !strings.Contains(err.Error(), "made before 'starling node forget n2'") {
		t.Fatalf("a new identity with an invitation made before the forget: %v", err)
	}
	// With a new invitation it is admitted under the same name.
	if err := n2.StartAgent(); err != nil {
		t.Fatal(err)
	}
	waitReadyNodes(t, n1, 2)
}

// TestStrangerAndNameThiefAreRefusedAtJoin: a program that holds nothing
// can neither join gossip in the clear nor be admitted with a made-up
// token (403, and a WARN on the node it asked) nor fetch an image from the
// peer port without a node certificate (401); an agent with a valid
// token but the name of a running node is refused at join with an error
// that names the conflict, and displaces nothing.
func TestStrangerAndNameThiefAreRefusedAtJoin(t *testing.T) {
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	waitReadyNodes(t, n1, 2)
	stranger, err := c.AddNode("stranger", 7)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+stranger.NetNS, hostile,
		"--stranger", "--name", "stranger", "--bind", stranger.IP, "--join", n1.IP).CombinedOutput()
	if err != nil {
		t.Fatalf("stranger: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "join with a made-up token: status 403") || !strings.Contains(string(out), "image blob without a node certificate: status 401") {
		t.Fatalf("the join endpoint did not refuse a made-up token:\n%s", out)
	}
	if nodes, _ := n1.CLI("get", "nodes"); strings.Contains(nodes, "stranger") {
		t.Fatalf("the stranger is listed:\n%s", nodes)
	}
	log, _ := os.ReadFile(n1.AgentLogPath())
	if !strings.Contains(string(log), "refused a node's join") || !strings.Contains(string(log), "status=403") {
		t.Fatalf("n1 logged no WARN for the refused join")
	}
	// A real agent with a valid token and n2's name.
	thief, err := c.AddNode("thief", 6)
	if err != nil {
		t.Fatal(err)
	}
	thief.Name = "n2"
	err = thief.StartAgent()
	if err == nil || !strings.Contains(err.Error(), `node name "n2" is in use by another node`) {
		t.Fatalf("an agent with a running node's name: %v", err)
	}
	log, _ = os.ReadFile(n1.AgentLogPath())
	if !strings.Contains(string(log), "status=409") {
		t.Fatalf("n1 logged no WARN for the name conflict")
	}
	nodes, err := n1.CLI("get", "nodes", "-o", "json")
	if err != nil || !strings.Contains(nodes, n2.PodSubnet) || strings.Contains(nodes, thief.IP) {
		t.Fatalf("n2's record changed: %v\n%s", err, nodes)
	}
}

// TestNodeThatRunsNothingIsLeftOutOfPlacement: a token holder publishes a
// valid, ready node record with large capacity (test/hostile --fake-api)
// but runs nothing. Replicas placed on it are not listed in its status, so
// after --ack-timeout the honest nodes leave it out of placement (a WARN
// names it, 'get nodes' shows it unresponsive) and a new Deployment's 4
// replicas all run on them; the rollout completes.
func TestNodeThatRunsNothingIsLeftOutOfPlacement(t *testing.T) {
	c := newCluster(t, 2, "--ack-timeout", "10s")
	n1 := c.Nodes[0]
	waitReadyNodes(t, n1, 2)
	importEcho(t, n1)
	startHostile(t, c, "fake", 5, "--fake-api")
	waitReadyNodes(t, n1, 3) // the fake node counts as ready
	apply(t, n1, deployment("spread", 4, "x"))
	waitFor(t, 60*time.Second, func() error {
		reps, err := replicas(n1)
		if err != nil {
			return err
		}
		running := 0
		for _, r := range reps {
			if r.Workload == "spread" && r.Phase == api.PhaseRunning && (r.Node == "n1" || r.Node == "n2") {
				running++
			}
		}
		if running != 4 {
			return fmt.Errorf("%d of 4 replicas run on honest nodes: %+v", running, reps)
		}
		return nil
	})
	nodes, err := n1.CLI("get", "nodes")
	if err != nil || !strings.Contains(nodes, "alive,unresponsive") {
		t.Fatalf("get nodes does not show the fake node unresponsive: %q %v", nodes, err)
	}
	log, _ := os.ReadFile(n1.AgentLogPath())
	if !strings.Contains(string(log), "does not list the replicas placed on it") || !strings.Contains(string(log), "node=fake") {
		t.Fatal("n1 logged no WARN naming the fake node")
	}
	if s, err := n1.CLI("rollout", "status", "deployment/spread"); err != nil {
		t.Fatalf("rollout status: %q %v", s, err)
	}
}

// TestCompromisedNodeCannotAddOrTakeANode: with every file of a live
// node's data dir (n2 joined with an invitation, so it holds the gossip
// key, the CA certificate, its own key and certificate, but no CA key)
// and the operator's API token, a program can neither add a node nor
// take one's name: an identity it mints for a new name (n9) or for n1 is
// refused at the join endpoint and at the peer port, its gossip status
// records for them are refused for their certificate on both honest
// nodes, neither is listed, n1 keeps its address, and the API no longer
// makes join tokens (410, naming the command that does).
func TestCompromisedNodeCannotAddOrTakeANode(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	waitReadyNodes(t, n1, 2)
	if _, err := os.Stat(filepath.Join(n2.DataDir, "ca.key")); err == nil {
		t.Fatal("n2, which joined with an invitation, holds the CA key")
	}
	thief, err := c.AddHost("thief", 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"n9", "n1"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+thief.NetNS, hostile,
			"--forgotten", n2.DataDir, "--name", name, "--bind", thief.IP, "--join", n1.IP).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("hostile --forgotten %s --name %s: %v\n%s", n2.DataDir, name, err, out)
		}
		t.Logf("with n2's files, as %s:\n%s", name, out)
		if !strings.Contains(string(out), "its own node key posing as the CA") ||
			!strings.Contains(string(out), "join with a minted invitation: status 403") ||
			!strings.Contains(string(out), "gossip keys with the minted certificate: ") || strings.Contains(string(out), "with the minted certificate: GIVEN") {
			t.Fatalf("a minted identity for %s was admitted or got the gossip keys:\n%s", name, out)
		}
	}
	for _, n := range []*harness.Node{n1, n2} {
		waitFor(t, 20*time.Second, func() error {
			m, err := metrics(n)
			if err != nil {
				return err
			}
			if m[`starling_rejected_records_total{reason="cert"}`] < 1 {
				return fmt.Errorf("%s has counted no certificate refusal", n.Name)
			}
			return nil
		})
		// The thief's gossip member n9 (it holds the gossip key) may be
		// listed as a member, but no record of it is taken: no subnet, no
		// API, no route; n1 keeps its address and subnet.
		out, err := n.CLI("get", "nodes", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Items []struct {
				Name, Advertise, PodSubnet string
				Ready                      bool
			}
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatal(err)
		}
		for _, it := range list.Items {
			if (it.Name == "n9" && (it.PodSubnet != "" || it.Ready)) || (it.Name == "n1" && (it.PodSubnet != n1.PodSubnet || strings.HasPrefix(it.Advertise, thief.IP))) {
				t.Fatalf("%s took a record of a minted identity: %+v\n%s", n.Name, it, out)
			}
		}
		if dp := dataplane(t, n); strings.Contains(dp, "via "+thief.IP) {
			t.Fatalf("%s routes to the thief:\n%s", n.Name, dp)
		}
	}
	hc, err := c.APIClient()
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", n1.APIURL()+"/v1/join-tokens", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusGone || !strings.Contains(string(body), "starling join-token NODE-NAME") {
		t.Fatalf("POST /v1/join-tokens with the API token: %d %s", resp.StatusCode, body)
	}
}
