package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/test/harness"
)

// lbPool is the LoadBalancer pool the test sets: a range of the harness's
// LAN (192.168.222.0/24) that holds no node (.11 to .13) nor the LAN
// namespace's own address (.254).
const lbPool = harness.LANPrefix + ".240/28"

// arpProbe asks the LAN, from the LAN namespace's bridge br0 (as any LAN
// host would), who has an address, and gathers the answers.
type arpProbe struct {
	c    *arp.Client
	seen []string
}

func newARPProbe(t *testing.T, lan string) *arpProbe {
	t.Helper()
	var c *arp.Client
	err := inNetns("/run/netns/"+lan, func() error {
		ifi, err := net.InterfaceByName("br0")
		if err != nil {
			return err
		}
		c, err = arp.Dial(ifi)
		return err
	})
	if err != nil {
		t.Fatalf("ARP probe in the LAN namespace: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &arpProbe{c: c}
}

// owners sends one ARP request for a and returns the hardware addresses
// that answered it within wait.
func (p *arpProbe) owners(a netip.Addr, wait time.Duration) ([]string, error) {
	if err := p.c.Request(a); err != nil {
		return nil, err
	}
	var macs []string
	deadline := time.Now().Add(wait)
	for {
		p.c.SetReadDeadline(deadline)
		pkt, _, err := p.c.Read()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return macs, nil
			}
			return macs, err
		}
		p.seen = append(p.seen, fmt.Sprintf("%v %v/%v -> %v/%v", pkt.Operation, pkt.SenderIP, pkt.SenderHardwareAddr, pkt.TargetIP, pkt.TargetHardwareAddr))
		if pkt.Operation == arp.OperationReply && pkt.SenderIP == a && pkt.TargetHardwareAddr.String() == p.c.HardwareAddr().String() &&
			!slices.Contains(macs, pkt.SenderHardwareAddr.String()) {
			macs = append(macs, pkt.SenderHardwareAddr.String())
		}
	}
}

// lbState is what the test reads of the cluster: each node's LAN MAC and
// which nodes hold an address on their LAN interface.
type lbState struct {
	c    *harness.Cluster
	macs map[string]string // MAC -> node name
}

func newLBState(t *testing.T, c *harness.Cluster) *lbState {
	s := &lbState{c: c, macs: map[string]string{}}
	for _, n := range c.Nodes {
		// ip, not /sys/class/net: sysfs shows the namespace it was mounted in.
		out, err := harness.NetNSExec(context.Background(), n.NetNS, "ip", "-o", "link", "show", "dev", "eth0")
		_, mac, ok := strings.Cut(out, "link/ether ")
		if err != nil || !ok || len(mac) < 17 {
			t.Fatalf("MAC of %s: %v %s", n.Name, err, out)
		}
		s.macs[mac[:17]] = n.Name
	}
	return s
}

// holders returns the nodes whose LAN interface is up and holds a: those
// that answer ARP for it (a node cut off keeps the address its killed
// agent put on its link, which is down).
func (s *lbState) holders(a netip.Addr) []string {
	var out []string
	for _, n := range s.c.Nodes {
		link, err := harness.NetNSExec(context.Background(), n.NetNS, "ip", "-o", "link", "show", "dev", "eth0")
		if err != nil || !strings.Contains(link, "state UP") {
			continue
		}
		o, err := harness.NetNSExec(context.Background(), n.NetNS, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if err == nil && strings.Contains(o, " "+a.String()+"/32 ") {
			out = append(out, n.Name)
		}
	}
	return out
}

// names maps MACs to node names.
func (s *lbState) names(macs []string) []string {
	var out []string
	for _, m := range macs {
		out = append(out, s.macs[m])
	}
	return out
}

// lbAddress waits until Service ns/name shows its LAN address in
// status.loadBalancer.ingress and returns it.
func lbAddress(t *testing.T, n *harness.Node, ns, name string) netip.Addr {
	t.Helper()
	var a netip.Addr
	waitFor(t, 30*time.Second, func() error {
		out, err := n.CLI("get", "services", name, "-n", ns, "-o", "json")
		if err != nil {
			return err
		}
		var svc corev1.Service
		if err := json.Unmarshal([]byte(out), &svc); err != nil {
			return err
		}
		if len(svc.Status.LoadBalancer.Ingress) != 1 {
			return fmt.Errorf("no address yet: %s", out)
		}
		a, err = netip.ParseAddr(svc.Status.LoadBalancer.Ingress[0].IP)
		return err
	})
	return a
}

// TestLoadBalancerAddressFailsOver: a LoadBalancer Service takes an
// address from the pool (`starling cluster lb-pool`), which get services
// shows as EXTERNAL-IP and a LAN client reaches; one node answers ARP for
// it. Its node is cut off 5 times: the address answers again from another
// node within failure detection + 1 s (the median printed), and ARP
// samples after each failover and each return show one owner, never two.
// Under a 2|1 partition with the owner alone, only the majority side
// announces. With externalTrafficPolicy Local, the address is announced
// by the one node with an endpoint and the client's address is kept
// (the Cluster Service's is masqueraded).
func TestLoadBalancerAddressFailsOver(t *testing.T) {
	// Failure detection in about a second, and a node back from a cut
	// counted again 2 s later, so that five failovers take a minute.
	c := newCluster(t, 3, "--probe-interval", "200ms", "--probe-timeout", "100ms", "--suspicion-mult", "3", "--rejoin-settle", "2s")
	n1 := c.Nodes[0]
	importEcho(t, c.Nodes...)
	waitReadyNodes(t, n1, 3)
	if out, err := n1.CLI("cluster", "lb-pool", harness.LANPrefix+".0/24"); err == nil || !strings.Contains(out+err.Error(), "holds node") {
		t.Fatalf("a pool holding the nodes' addresses was taken: %v %s", err, out)
	}
	if out, err := n1.CLI("cluster", "lb-pool", lbPool); err != nil {
		t.Fatalf("lb-pool: %v %s", err, out)
	}
	const ns = "lb-e2e"
	web := echoApp("web", 3, "")
	web.Namespace = ns
	local := echoApp("solo", 1, "")
	local.Namespace = ns
	apply(t, n1, harness.Manifests(
		web.Deployment(),
		web.Service("web", []corev1.ServicePort{harness.ServicePort(80, "8080")}, func(s *corev1.ServiceSpec) { s.Type = corev1.ServiceTypeLoadBalancer }),
		local.Deployment(),
		local.Service("solo", []corev1.ServicePort{harness.ServicePort(80, "8080")}, func(s *corev1.ServiceSpec) {
			s.Type, s.ExternalTrafficPolicy = corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal
		}),
	))
	waitRunning(t, n1, "web", 3, 90*time.Second)
	solos, _ := waitRunning(t, n1, "solo", 1, 90*time.Second)
	addr, soloAddr := lbAddress(t, n1, ns, "web"), lbAddress(t, n1, ns, "solo")
	if pool := netip.MustParsePrefix(lbPool); !pool.Contains(addr) || !pool.Contains(soloAddr) || addr == soloAddr {
		t.Fatalf("addresses %v and %v: want two of the pool %s", addr, soloAddr, pool)
	}
	out, err := n1.CLI("get", "services", "-n", ns)
	if err != nil || !strings.Contains(out, "EXTERNAL-IP") || !strings.Contains(out, addr.String()) {
		t.Fatalf("get services shows no EXTERNAL-IP %s: %v\n%s", addr, err, out)
	}
	t.Logf("get services:\n%s", out)
	url := "http://" + addr.String() + "/"
	st := newLBState(t, c)
	probe := newARPProbe(t, c.LAN)
	// oneOwner checks, with 5 ARP requests from the LAN, that one node
	// answers for a, the one whose interface holds it, and returns it.
	oneOwner := func(t *testing.T, a netip.Addr, when string) string {
		t.Helper()
		var owner string
		for range 5 {
			macs, err := probe.owners(a, 150*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			held := st.holders(a)
			if len(macs) != 1 || len(held) != 1 || st.macs[macs[0]] != held[0] {
				t.Fatalf("%s: ARP answered by %v, interfaces holding %v: %v; want one owner (probe %v read %q)", when, st.names(macs), a, held, probe.c.HardwareAddr(), probe.seen)
			}
			owner = held[0]
		}
		return owner
	}
	waitFor(t, 20*time.Second, func() error {
		if h := st.holders(addr); len(h) != 1 {
			return fmt.Errorf("holders of %v: %v", addr, h)
		}
		_, err := harness.HTTPGet(c.LAN, url, 2*time.Second)
		return err
	})
	oneOwner(t, addr, "after start")

	// back brings a node back (start), waits until every node is ready and
	// the node has settled (--rejoin-settle), then checks one owner.
	back := func(t *testing.T, start func() error, when string) {
		t.Helper()
		if err := start(); err != nil {
			t.Fatal(err)
		}
		waitReadyNodes(t, n1, 3)
		time.Sleep(3 * time.Second)
		waitFor(t, 20*time.Second, func() error {
			if h := st.holders(addr); len(h) != 1 {
				return fmt.Errorf("%s: holders %v", when, h)
			}
			return nil
		})
		oneOwner(t, addr, when)
	}

	t.Run("Local keeps the client address and is announced by the endpoint's node", func(t *testing.T) {
		waitFor(t, 20*time.Second, func() error {
			if h := st.holders(soloAddr); !slices.Equal(h, []string{solos[0].Node}) {
				return fmt.Errorf("holders of %v: %v, want the endpoint's node %s", soloAddr, h, solos[0].Node)
			}
			return nil
		})
		if got := oneOwner(t, soloAddr, "Local"); got != solos[0].Node {
			t.Fatalf("Local address answered by %s, want %s", got, solos[0].Node)
		}
		body, err := harness.HTTPGet(c.LAN, "http://"+soloAddr.String()+"/", 3*time.Second)
		if err != nil || !strings.Contains(body, "remote="+harness.LANPrefix+".254:") {
			t.Fatalf("Local: want the LAN client's address kept: %v\n%s", err, body)
		}
		body, err = harness.HTTPGet(c.LAN, url, 3*time.Second)
		if err != nil || strings.Contains(body, "remote="+harness.LANPrefix+".254:") {
			t.Fatalf("Cluster: want the client masqueraded: %v\n%s", err, body)
		}
	})

	t.Run("failover", func(t *testing.T) {
		var failovers, beyond []time.Duration
		for i := range 5 {
			owner := nodeNamed(c, oneOwner(t, addr, fmt.Sprintf("before cut %d", i+1)))
			var watcher *harness.Node
			for _, n := range c.Nodes {
				if n != owner {
					watcher = n
					break
				}
			}
			cut := time.Now()
			if err := owner.CutOff(); err != nil {
				t.Fatal(err)
			}
			detected := make(chan time.Duration, 1)
			go func() {
				for time.Since(cut) < 30*time.Second {
					nodes, err := watcher.API().Nodes(context.Background())
					for _, m := range nodes {
						if err == nil && m.Name == owner.Name && m.State == "dead" {
							detected <- time.Since(cut)
							return
						}
					}
					time.Sleep(50 * time.Millisecond)
				}
				detected <- 30 * time.Second
			}()
			var answered time.Duration
			for {
				if _, err := harness.HTTPGet(c.LAN, url, 250*time.Millisecond); err == nil {
					answered = time.Since(cut)
					break
				}
				if time.Since(cut) > 30*time.Second {
					t.Fatalf("cut %d: the address did not answer again within 30 s", i+1)
				}
				time.Sleep(20 * time.Millisecond)
			}
			detect := <-detected
			failovers, beyond = append(failovers, answered), append(beyond, answered-detect)
			newOwner := oneOwner(t, addr, fmt.Sprintf("after failover %d", i+1))
			t.Logf("cut %d: %s cut off; detected dead after %v, the address answered again from %s after %v (%v after detection)",
				i+1, owner.Name, detect.Round(10*time.Millisecond), newOwner, answered.Round(10*time.Millisecond), (answered - detect).Round(10*time.Millisecond))
			if newOwner == owner.Name {
				t.Fatalf("cut %d: the cut node still owns the address", i+1)
			}
			if answered > detect+time.Second {
				t.Errorf("cut %d: answered %v after failure detection, want within 1 s", i+1, answered-detect)
			}
			back(t, owner.Reconnect, fmt.Sprintf("after return %d", i+1))
		}
		slices.Sort(failovers)
		slices.Sort(beyond)
		t.Logf("LoadBalancer failover over 5 cuts: median %v from the cut (%v after failure detection); all: %v",
			failovers[2].Round(10*time.Millisecond), beyond[2].Round(10*time.Millisecond), failovers)
	})

	t.Run("agent killed, host up: its watchdog takes the address off", func(t *testing.T) {
		owner := nodeNamed(c, oneOwner(t, addr, "before the kill"))
		owner.KillAgent(syscall.SIGKILL)
		var both time.Duration // how long the killed agent's host and the new owner both held it
		var last time.Time
		took, err := eventually(15*time.Second, func() error {
			h := st.holders(addr)
			if len(h) > 1 {
				if !last.IsZero() {
					both += time.Since(last)
				}
				last = time.Now()
			} else {
				last = time.Time{}
			}
			if len(h) != 1 || h[0] == owner.Name {
				return fmt.Errorf("holders of %v with %s's agent killed: %v", addr, owner.Name, h)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s's agent killed (its host up): the address held by another node only, %v later (both held it for about %v of the samples: detection here, about 1 s, is faster than the watchdog's 1.5 s lease)",
			owner.Name, took.Round(10*time.Millisecond), both.Round(10*time.Millisecond))
		if took > 5*time.Second {
			t.Errorf("the killed agent's host held the address %v, want its watchdog to take it off within a few seconds", took)
		}
		oneOwner(t, addr, "after the kill")
		if _, err := harness.HTTPGet(c.LAN, url, 2*time.Second); err != nil {
			t.Fatalf("after the kill: %v", err)
		}
		back(t, owner.RestartAgent, "after the restart")
	})

	t.Run("partition: only the majority announces", func(t *testing.T) {
		owner := nodeNamed(c, oneOwner(t, addr, "before the partition"))
		if err := c.Partition([]*harness.Node{owner}); err != nil {
			t.Fatal(err)
		}
		defer c.Heal()
		took, err := eventually(15*time.Second, func() error {
			h := st.holders(addr)
			if len(h) != 1 || h[0] == owner.Name {
				return fmt.Errorf("holders of %v with %s alone: %v; want one node of the majority", addr, owner.Name, h)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s alone on its side: it withdrew the address and the majority announces it %v after the partition", owner.Name, took.Round(10*time.Millisecond))
		// Settled: the minority holds nothing, through a few seconds.
		for range 3 {
			h := st.holders(addr)
			if len(h) != 1 || h[0] == owner.Name || slices.Contains(st.holders(soloAddr), owner.Name) {
				t.Fatalf("under the partition: holders %v (minority %s)", h, owner.Name)
			}
			oneOwner(t, addr, "majority side")
			time.Sleep(time.Second)
		}
		if _, err := harness.HTTPGet(c.LAN, url, 2*time.Second); err != nil {
			t.Fatalf("the majority side's address does not answer: %v", err)
		}
		if err := c.Heal(); err != nil {
			t.Fatal(err)
		}
		waitReadyNodes(t, n1, 3)
		waitFor(t, 20*time.Second, func() error {
			if h := st.holders(addr); len(h) != 1 {
				return fmt.Errorf("holders after healing: %v", h)
			}
			return nil
		})
		oneOwner(t, addr, "after healing")
	})
}
