package e2e

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// TestDisplacedSubnetMovesWithItsPods: n3 drops off the LAN for longer
// than --subnet-reclaim-after; a new node, m, joins the others and claims
// n3's subnet, which they then count as free, and runs pods on it. When
// the LAN heals, n3 and m both hold that subnet, settled. Every node takes
// the earlier claim, n3's, as its holder and routes the subnet to n3, so
// m gives the subnet up, claims another, and rebuilds its pods there: in
// the end every replica answers at an address of its own node's subnet,
// reached from another node and from m (whose route to its old subnet now
// leads to n3), and m's bridge keeps nothing of the old subnet. Before, a settled claim never moved: m kept running pods at
// addresses no peer routed to it, and was never eligible again.
func TestDisplacedSubnetMovesWithItsPods(t *testing.T) {
	t.Parallel() // mostly waiting for failure detection: runs beside another such test
	// A dead node's subnet is free 5 s after its last record, once the
	// arbiters of its claim check forget it: 10 rounds of (--subnet-settle
	// + 5 s) after it asked them (node/claimcheck.go askedFor), 60 s here.
	flags := []string{"--subnet-reclaim-after=5s", "--subnet-settle=1s"}
	const forgotten = 62 * time.Second
	c := emptyCluster(t)
	var claimed time.Time
	for i := 1; i <= 3; i++ {
		n, err := c.AddNode(fmt.Sprintf("n%d", i), i)
		if err != nil {
			t.Fatal(err)
		}
		n.PodSubnet = "" // claims a /24 by itself
		if err := n.StartAgent(append(flags, "--node-label=zone="+n.Name)...); err != nil {
			t.Fatal(err)
		}
		claimed = time.Now()
	}
	n1, n3 := c.Nodes[0], c.Nodes[2]
	importEcho(t, n1)
	waitReadyNodes(t, n1, 3)
	held := n3.PodSubnet
	// A replica that runs on n3 through the cut and after.
	pinned := echoApp("pinned", 1, "pinned")
	pinned.Pod = func(p *corev1.PodSpec) { p.NodeSelector = map[string]string{"zone": "n3"} }
	apply(t, n1, pinned.Deployment())
	waitFor(t, 60*time.Second, func() error { _, err := readyOnePerNode(n1, "pinned", 1); return err })

	if err := c.Partition([]*harness.Node{n3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, func() error {
		nodes, err := getNodes(n1)
		if err != nil {
			return err
		}
		if s := nodes[n3.Name].State; s == "alive" || s == "suspect" {
			return fmt.Errorf("n1 sees n3 %s", s)
		}
		return nil
	})
	time.Sleep(max(6*time.Second, time.Until(claimed.Add(forgotten))))

	m, err := c.AddNode(nameStartingAt(t, held), 4)
	if err != nil {
		t.Fatal(err)
	}
	m.PodSubnet = ""
	if err := m.StartAgent(flags...); err != nil {
		t.Fatal(err)
	}
	if m.PodSubnet != held {
		t.Fatalf("%s claimed %s, not n3's reclaimed %s: the test's setup failed", m.Name, m.PodSubnet, held)
	}
	t.Logf("n3 cut off; %s joined and claimed n3's subnet %s", m.Name, held)
	apply(t, n1, deployment("moved", 6, "moved"))
	waitFor(t, 90*time.Second, func() error {
		rs, err := replicas(n1)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.Workload == "moved" && r.Node == m.Name && r.Ready {
				return nil
			}
		}
		return fmt.Errorf("no ready replica of moved on %s yet", m.Name)
	})

	healed := time.Now()
	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	var nodes map[string]nodeItem
	took, err := eventually(120*time.Second, func() (err error) {
		if nodes, err = getNodes(n1); err != nil {
			return err
		}
		for _, n := range c.Nodes {
			if s := nodes[n.Name]; s.State != "alive" || !s.Ready {
				return fmt.Errorf("%s: %+v", n.Name, s)
			}
		}
		if nodes[n3.Name].PodSubnet != held {
			return fmt.Errorf("n3, whose claim was earlier, holds %s, not %s", nodes[n3.Name].PodSubnet, held)
		}
		seen := map[string]string{}
		for _, n := range c.Nodes {
			sub := nodes[n.Name].PodSubnet
			if other, dup := seen[sub]; dup {
				return fmt.Errorf("%s and %s both hold %s", other, n.Name, sub)
			}
			seen[sub] = n.Name
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s moved from %s to %s %v after the heal", m.Name, held, nodes[m.Name].PodSubnet, took.Round(time.Millisecond))
	if !strings.Contains(m.Tail(400), "moving this node and its pods to another subnet") {
		t.Errorf("%s's log does not say why it moved", m.Name)
	}

	// Every replica runs once, ready, at an address of its node's subnet,
	// and answers there from n1 and m: routes and sandboxes follow the
	// move. n3 runs pinned (and maybe some of moved) on the subnet m left.
	waitFor(t, 120*time.Second, func() error {
		rs, err := replicas(n1)
		if err != nil {
			return err
		}
		ready, onMoved, onHolder := 0, 0, 0
		for _, r := range rs {
			if r.Workload != "moved" && r.Workload != "pinned" {
				continue
			}
			if r.Phase != api.PhaseRunning || !r.Ready {
				return fmt.Errorf("%s on %s: %s, ready %v", r.Name, r.Node, r.Phase, r.Ready)
			}
			ip, err := netip.ParseAddr(r.PodIP)
			sub, _ := netip.ParsePrefix(nodes[r.Node].PodSubnet)
			if err != nil || !sub.Contains(ip) {
				return fmt.Errorf("%s on %s at %q, outside %s", r.Name, r.Node, r.PodIP, sub)
			}
			// From n1, and from the moved node, whose route to its old
			// subnet must now lead to n3.
			for _, from := range []*harness.Node{n1, m} {
				body, err := harness.HTTPGet(from.NetNS, "http://"+r.PodIP+":8080/", 2*time.Second)
				if err != nil {
					return fmt.Errorf("%s on %s at %s from %s: %v", r.Name, r.Node, r.PodIP, from.Name, err)
				}
				if got := field(body, "podIP"); got != r.PodIP {
					return fmt.Errorf("%s from %s: answered by %s (routed to the wrong node?)", r.PodIP, from.Name, got)
				}
			}
			ready++
			switch r.Node {
			case m.Name:
				onMoved++
			case n3.Name:
				onHolder++
			}
		}
		if ready != 7 || onMoved == 0 || onHolder == 0 {
			return fmt.Errorf("%d of 7 replicas ready and answering, %d on %s, %d on n3", ready, onMoved, m.Name, onHolder)
		}
		return nil
	})
	out, err := m.Exec(t.Context(), "ip", "-4", "-o", "addr", "show", "dev", "starling0")
	if err != nil {
		t.Fatal(err)
	}
	old := netip.MustParsePrefix(held)
	if strings.Contains(out, " "+old.Addr().Next().String()+"/") {
		t.Fatalf("%s's bridge still holds the gateway of %s:\n%s", m.Name, held, out)
	}
	t.Logf("all 7 replicas answer at their node's subnet from n1 and the moved node, %v after the heal", time.Since(healed).Round(time.Millisecond))
}

// nodeItem is a node as `get nodes -o json` shows it.
type nodeItem struct {
	Name, State, PodSubnet string
	Ready                  bool
}

// getNodes is `get nodes` on n, by name.
func getNodes(n *harness.Node) (map[string]nodeItem, error) {
	out, err := n.CLI("get", "nodes", "-o", "json")
	if err != nil {
		return nil, err
	}
	var l struct{ Items []nodeItem }
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return nil, fmt.Errorf("decode get nodes: %w: %s", err, out)
	}
	byName := map[string]nodeItem{}
	for _, it := range l.Items {
		byName[it.Name] = it
	}
	return byName, nil
}

// nameStartingAt returns a node name whose subnet search (net/ipam.Pick,
// over the default --cluster-cidr 10.22.0.0/16) starts at subnet.
func nameStartingAt(t *testing.T, subnet string) string {
	t.Helper()
	p := netip.MustParsePrefix(subnet)
	want := uint32(p.Addr().As4()[2])
	for i := 0; i < 1_000_000; i++ {
		name := fmt.Sprintf("m%d", i)
		h := fnv.New32a()
		h.Write([]byte(name))
		if h.Sum32()%256 == want {
			return name
		}
	}
	t.Fatalf("no name starts at %s", subnet)
	return ""
}
