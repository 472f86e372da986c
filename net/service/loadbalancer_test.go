package service

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestAllocateLBIsDeterministicAndKeepsRequests: requested addresses go
// to the oldest asker; the others get pool addresses from their key's
// hash, never the pool's first and last nor a reserved one, the same
// whatever the order of the input; a full pool leaves a Service pending.
func TestAllocateLBIsDeterministicAndKeepsRequests(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prefix := netip.MustParsePrefix("192.168.1.240/29") // .241 to .246 usable
	node := netip.MustParseAddr("192.168.1.243")
	asked := netip.MustParseAddr("192.168.1.246")
	pool := LBPool{Prefix: prefix, Reserved: func(a netip.Addr) bool { return a == node }}
	specs := []Spec{
		{Key: "ns/old", Created: t0, LoadBalancer: true, LoadBalancerIP: asked},
		{Key: "ns/young", Created: t0.Add(time.Second), LoadBalancer: true, LoadBalancerIP: asked},
		{Key: "ns/node", Created: t0, LoadBalancer: true, LoadBalancerIP: node},
		{Key: "ns/plain", Created: t0},
	}
	for i := range 4 {
		specs = append(specs, Spec{Key: "ns/s" + string(rune('a'+i)), Created: t0.Add(time.Duration(i) * time.Minute), LoadBalancer: true})
	}
	got, pending := AllocateLB(specs, pool)
	if got["ns/old"] != asked {
		t.Errorf("the oldest asker lost its requested address: %v", got)
	}
	for _, k := range []string{"ns/young", "ns/node", "ns/plain"} {
		if a, ok := got[k]; ok {
			t.Errorf("%s got %v, want none (taken, a node's, not a LoadBalancer)", k, a)
		}
	}
	if !strings.Contains(pending["ns/young"], "ns/old") || !strings.Contains(pending["ns/node"], "node") {
		t.Errorf("pending reasons: %q", pending)
	}
	seen := map[netip.Addr]string{}
	for k, a := range got {
		if !prefix.Contains(a) || a == prefix.Addr() || a == netip.MustParseAddr("192.168.1.247") || a == node {
			t.Errorf("%s got %v: outside the pool's usable addresses or reserved", k, a)
		}
		if seen[a] != "" {
			t.Errorf("%v given to %s and %s", a, seen[a], k)
		}
		seen[a] = k
	}
	if len(seen) != 5 {
		t.Errorf("5 usable addresses for 5 Services, got %v", got)
	}
	// Six asking for five addresses: the youngest waits.
	more := append(append([]Spec(nil), specs...), Spec{Key: "ns/last", Created: t0.Add(time.Hour), LoadBalancer: true})
	full, pending := AllocateLB(more, pool)
	if _, ok := full["ns/last"]; ok || !strings.Contains(pending["ns/last"], "full") {
		t.Errorf("a full pool gave ns/last %v (pending: %q)", full["ns/last"], pending["ns/last"])
	}
	rev := append([]Spec(nil), more...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	again, _ := AllocateLB(rev, pool)
	for k, a := range full {
		if again[k] != a {
			t.Errorf("order changed %s's address: %v, then %v", k, a, again[k])
		}
	}
	if none, _ := AllocateLB(specs[4:], LBPool{}); len(none) != 0 {
		t.Error("no pool, no request: an address was given")
	}
	one, _ := AllocateLB([]Spec{{Key: "ns/a", LoadBalancer: true}}, LBPool{Prefix: netip.MustParsePrefix("192.168.1.250/32")})
	if one["ns/a"] != netip.MustParseAddr("192.168.1.250") {
		t.Errorf("a /32 pool is its one address: %v", one)
	}
}

// TestAllocateLBRefusesAddressesOutsideThePool: a record (from any
// node) asking for the LAN's gateway, another host, the pool's network
// or broadcast address, a node's address, a ClusterIP or a pod's address
// gets none, and a pool overlapping the service or cluster CIDR gives
// nothing at all.
func TestAllocateLBRefusesAddressesOutsideThePool(t *testing.T) {
	serviceCIDR, podCIDR := netip.MustParsePrefix("10.23.0.0/16"), netip.MustParsePrefix("10.22.0.0/16")
	node := netip.MustParseAddr("192.168.1.245")
	pool := LBPool{Prefix: netip.MustParsePrefix("192.168.1.240/28"), Forbidden: []netip.Prefix{serviceCIDR, podCIDR},
		Reserved: func(a netip.Addr) bool { return a == node }}
	cases := []struct {
		name string
		ip   string
		pool *netip.Prefix
		want bool
	}{
		{name: "inside the pool", ip: "192.168.1.244", want: true},
		{name: "the gateway", ip: "192.168.1.1"},
		{name: "the pool's network address", ip: "192.168.1.240"},
		{name: "the pool's broadcast address", ip: "192.168.1.255"},
		{name: "a node's address", ip: node.String()},
		{name: "a ClusterIP", ip: "10.23.0.10"},
		{name: "a pod's address", ip: "10.22.1.5"},
		{name: "a host on the internet", ip: "1.1.1.1"},
		{name: "the limited broadcast", ip: "255.255.255.255"},
		{name: "IPv6", ip: "fd00::1"},
		{name: "pool overlapping the service CIDR", ip: "10.23.0.10", pool: &serviceCIDR},
		{name: "pool overlapping the cluster CIDR", ip: "10.22.1.5", pool: &podCIDR},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := pool
			if c.pool != nil {
				p.Prefix = *c.pool
			}
			specs := []Spec{{Key: "ns/asks", LoadBalancer: true, LoadBalancerIP: netip.MustParseAddr(c.ip)}, {Key: "ns/any", LoadBalancer: true}}
			got, pending := AllocateLB(specs, p)
			if _, ok := got["ns/asks"]; ok != c.want {
				t.Errorf("%s: got %v, want an address: %v (pending %q)", c.ip, got, c.want, pending)
			}
			if !c.want && pending["ns/asks"] == "" {
				t.Errorf("%s: pending without a reason", c.ip)
			}
			if _, ok := got["ns/any"]; ok == (c.pool != nil) {
				t.Errorf("pool %v: ns/any got %v (pending %q)", p.Prefix, got["ns/any"], pending["ns/any"])
			}
		})
	}
}

// TestAllocateLBOlderServiceKeepsItsAddress: a newer Service asking for
// the address an older one got from the pool gets none; the older keeps it.
func TestAllocateLBOlderServiceKeepsItsAddress(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pool := LBPool{Prefix: netip.MustParsePrefix("192.168.1.240/29")}
	specs := lbServices(t0, 4)
	before, _ := AllocateLB(specs, pool)
	thief := Spec{Key: "other/thief", Created: t0.Add(time.Hour), LoadBalancer: true, LoadBalancerIP: before["ns/s1"]}
	after, pending := AllocateLB(append(specs, thief), pool)
	if after["ns/s1"] != before["ns/s1"] {
		t.Errorf("ns/s1 lost %v to a newer Service's request: now %v", before["ns/s1"], after["ns/s1"])
	}
	if _, ok := after["other/thief"]; ok || pending["other/thief"] == "" {
		t.Errorf("the newer Service got %v (pending %q), want none", after["other/thief"], pending["other/thief"])
	}
}

// lbServices are n LoadBalancer Services ns/s0.. created a minute apart.
func lbServices(t0 time.Time, n int) []Spec {
	var specs []Spec
	for i := range n {
		specs = append(specs, Spec{Key: fmt.Sprintf("ns/s%d", i), Created: t0.Add(time.Duration(i) * time.Minute), LoadBalancer: true})
	}
	return specs
}

// TestAllocateLBDeletionMovesOnlyYounger: the property deleting a Service
// keeps. For random sets of Services (some requesting addresses) in
// pools small and large: deleting any one Service D never changes the
// address of a Service created before D; a Service that moves (or that
// was pending and gets one) moves only into an address D or another
// mover held before, so no Service moves into an address that was free.
func TestAllocateLBDeletionMovesOnlyYounger(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(1, 2))
	moved, deletions := 0, 0
	for round := range 200 {
		pool := LBPool{Prefix: netip.MustParsePrefix([]string{"192.168.1.240/28", "192.168.1.248/29", "192.168.0.0/24"}[round%3])}
		specs := lbServices(t0, 1+rng.IntN(20))
		for i := range specs {
			specs[i].Created = t0.Add(time.Duration(rng.IntN(5)) * time.Minute) // ties too: then by key
			if rng.IntN(5) == 0 {
				specs[i].LoadBalancerIP = netip.AddrFrom4([4]byte{192, 168, 1, byte(240 + rng.IntN(16))})
			}
		}
		all, _ := AllocateLB(specs, pool)
		for d, del := range specs {
			rest := slices.Delete(slices.Clone(specs), d, d+1)
			after, _ := AllocateLB(rest, pool)
			freed := map[netip.Addr]bool{}
			if a, ok := all[del.Key]; ok {
				freed[a] = true
			}
			for _, s := range rest {
				if after[s.Key] == all[s.Key] {
					continue
				}
				moved++
				if s.Created.Before(del.Created) || s.Created.Equal(del.Created) && s.Key < del.Key {
					t.Fatalf("deleting %s moved the older %s: %v -> %v", del.Key, s.Key, all[s.Key], after[s.Key])
				}
				if a, ok := all[s.Key]; ok {
					freed[a] = true
				}
			}
			for _, s := range rest {
				if a, ok := after[s.Key]; ok && a != all[s.Key] && !freed[a] {
					t.Fatalf("deleting %s moved %s into %v, which was free before", del.Key, s.Key, a)
				}
			}
			deletions++
		}
	}
	t.Logf("%d deletions moved %d Services", deletions, moved)
}

// TestALoadBalancerServiceGetsANodePort: as in Kubernetes.
func TestALoadBalancerServiceGetsANodePort(t *testing.T) {
	_, cidr, _ := net.ParseCIDR("10.23.0.0/24")
	a := Allocate([]Spec{{Key: "ns/lb", LoadBalancer: true, Ports: []SpecPort{{Name: "http"}}}}, cidr)
	if a.NodePorts["ns/lb/http"] == 0 {
		t.Errorf("no NodePort: %v", a.NodePorts)
	}
}

func lbPort(local bool, eps ...string) Port {
	p := webPort(eps...)
	p.NodePort, p.LoadBalancer, p.Local = 30080, netip.MustParseAddr("192.168.222.240"), local
	return p
}

var nodeSubnet = netip.MustParsePrefix("10.22.1.0/24")

// TestLoadBalancerRules: traffic to the LAN address at the port goes to
// the endpoints, masqueraded (Cluster) or, with Local, to this node's
// endpoints only with the client's address kept; refused when there are
// none, in both backends.
func TestLoadBalancerRules(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR, NodeSubnet: nodeSubnet}
	cases := []struct {
		name           string
		port           Port
		masqAll        bool // cfg.MasqueradeAll
		iptables, nft  []string
		notIPT, notNFT []string
	}{
		{
			name: "cluster",
			port: lbPort(false, "10.22.1.2:8080", "10.22.2.2:8080"),
			iptables: []string{`-d 192.168.222.240/32 -p tcp -m tcp --dport 80 -m comment --comment "default/web:http/TCP" -j STARLING-LB-`,
				"-j STARLING-MARK-MASQ\n-A STARLING-LB-"},
			nft: []string{"192.168.222.240 . tcp . 80 : goto loadbalancer-", "192.168.222.240 . tcp . 80 . 1 : 10.22.2.2 . 8080",
				"jump mark-for-masquerade\n\t\tgoto pick-2"},
		},
		{
			name:     "local",
			port:     lbPort(true, "10.22.1.2:8080", "10.22.2.2:8080"),
			iptables: []string{`-d 192.168.222.240/32 -p tcp -m tcp --dport 80 -m comment --comment "default/web:http/TCP" -j STARLING-LB-`},
			notIPT:   []string{"-j STARLING-MARK-MASQ\n-A STARLING-LB-"},
			nft:      []string{"192.168.222.240 . tcp . 80 : goto loadbalancer-", "192.168.222.240 . tcp . 80 . 0 : 10.22.1.2 . 8080", "chain pick-1 {"},
			notNFT:   []string{"192.168.222.240 . tcp . 80 . 1 :"},
		},
		{
			name:     "local with masquerade-all",
			port:     lbPort(true, "10.22.1.2:8080", "10.22.2.2:8080"),
			masqAll:  true,
			iptables: []string{"-j STARLING-MARK-MASQ\n-A STARLING-LB-"},
			nft:      []string{"jump mark-for-masquerade\n\t\tgoto pick-1"},
		},
		{
			name:     "local without a local endpoint",
			port:     lbPort(true, "10.22.2.2:8080"),
			iptables: []string{"-A STARLING-REJECT -d 192.168.222.240/32 -p tcp -m tcp --dport 80"},
			notIPT:   []string{":STARLING-LB-"},
			nft:      []string{"192.168.222.240 . tcp . 80 : goto reject-chain"},
			notNFT:   []string{"loadbalancer-"},
		},
		{
			name:     "no endpoints",
			port:     lbPort(false),
			iptables: []string{"-A STARLING-REJECT -d 192.168.222.240/32 -p tcp -m tcp --dport 80"},
			nft:      []string{"192.168.222.240 . tcp . 80 : goto reject-chain"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := cfg
			cfg.MasqueradeAll = c.masqAll
			ipt, nft := string(Rules([]Port{c.port}, cfg)), string(NFTText([]Port{c.port}, cfg))
			hasRules(t, ipt, c.iptables...)
			hasRules(t, nft, c.nft...)
			for _, s := range c.notIPT {
				if strings.Contains(ipt, s) {
					t.Errorf("iptables rules hold %q:\n%s", s, ipt)
				}
			}
			for _, s := range c.notNFT {
				if strings.Contains(nft, s) {
					t.Errorf("nft table holds %q:\n%s", s, nft)
				}
			}
		})
	}
}

// TestLoadBalancerChangesAreIncremental: giving a port an address, then
// taking it away, is a change of that port, rendered by both backends,
// and the model reports it.
func TestLoadBalancerChangesAreIncremental(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR, NodeSubnet: nodeSubnet}
	plain := webPort("10.22.1.2:8080")
	var m Model
	m.Update([]Port{plain}, cfg)
	lb := plain
	lb.LoadBalancer = netip.MustParseAddr("192.168.222.240")
	c := m.Update([]Port{lb}, cfg)
	if len(c.Updated) != 1 {
		t.Fatalf("an address given: %+v", c)
	}
	hasRules(t, string(ChangeText(c, cfg)), "-I STARLING-SERVICES 1 -d 192.168.222.240/32", ":STARLING-LB-")
	if chains, elems := NFTChange(c, cfg); chains == 0 || elems == 0 {
		t.Errorf("nft change of an address given: %d chains, %d elements", chains, elems)
	}
	local := lb
	local.Local = true
	if c := m.Update([]Port{local}, cfg); len(c.Updated) != 1 {
		t.Fatalf("Local set: %+v", c)
	}
	c = m.Update([]Port{plain}, cfg)
	text := string(ChangeText(c, cfg))
	hasRules(t, text, "-D STARLING-SERVICES -d 192.168.222.240/32", "-X STARLING-LB-")
}
