package service

import (
	"net"
	"net/netip"
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
	pool := netip.MustParsePrefix("192.168.1.240/29") // .241 to .246 usable
	node := netip.MustParseAddr("192.168.1.243")
	reserved := func(a netip.Addr) bool { return a == node }
	specs := []Spec{
		{Key: "ns/old", Created: t0, LoadBalancer: true, LoadBalancerIP: netip.MustParseAddr("192.168.1.100")},
		{Key: "ns/young", Created: t0.Add(time.Second), LoadBalancer: true, LoadBalancerIP: netip.MustParseAddr("192.168.1.100")},
		{Key: "ns/node", Created: t0, LoadBalancer: true, LoadBalancerIP: node},
		{Key: "ns/plain", Created: t0},
	}
	for i := range 5 {
		specs = append(specs, Spec{Key: "ns/s" + string(rune('a'+i)), Created: t0.Add(time.Duration(i) * time.Minute), LoadBalancer: true})
	}
	got := AllocateLB(specs, pool, reserved)
	if got["ns/old"] != netip.MustParseAddr("192.168.1.100") {
		t.Errorf("the oldest asker lost its requested address: %v", got)
	}
	for _, k := range []string{"ns/young", "ns/node", "ns/plain"} {
		if a, ok := got[k]; ok {
			t.Errorf("%s got %v, want none (taken, a node's, not a LoadBalancer)", k, a)
		}
	}
	seen := map[netip.Addr]string{}
	for k, a := range got {
		if k == "ns/old" {
			continue
		}
		if !pool.Contains(a) || a == pool.Addr() || a == netip.MustParseAddr("192.168.1.247") || a == node {
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
	full := AllocateLB(more, pool, reserved)
	if _, ok := full["ns/last"]; ok {
		t.Errorf("a full pool gave ns/last %v", full["ns/last"])
	}
	rev := append([]Spec(nil), more...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	again := AllocateLB(rev, pool, reserved)
	for k, a := range full {
		if again[k] != a {
			t.Errorf("order changed %s's address: %v, then %v", k, a, again[k])
		}
	}
	if len(AllocateLB(specs[3:], netip.Prefix{}, nil)) != 0 {
		t.Error("no pool, no request: an address was given")
	}
	one := AllocateLB([]Spec{{Key: "ns/a", LoadBalancer: true}}, netip.MustParsePrefix("192.168.1.250/32"), nil)
	if one["ns/a"] != netip.MustParseAddr("192.168.1.250") {
		t.Errorf("a /32 pool is its one address: %v", one)
	}
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
