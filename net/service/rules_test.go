package service

import (
	"fmt"
	"math/rand"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func webPort(eps ...string) Port {
	return Port{Service: "default/web", Name: "http", Protocol: TCP, ClusterIP: netip.MustParseAddr("10.23.0.10"), Port: 80, Endpoints: addrPorts(eps...)}
}

func addrPorts(eps ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, e := range eps {
		out = append(out, netip.MustParseAddrPort(e))
	}
	return out
}

var clusterCIDR = netip.MustParsePrefix("10.22.0.0/16")

// hasRules fails t for each of wants that the rules text lacks.
func hasRules(t *testing.T, text string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(text, want) {
			t.Errorf("rules lack %q:\n%s", want, text)
		}
	}
}

func TestRulesSpreadEvenlyOverEndpoints(t *testing.T) {
	text := string(Rules([]Port{webPort("10.22.1.2:8080", "10.22.2.2:8080", "10.22.3.2:8080")}, Config{ClusterCIDR: clusterCIDR}))
	hasRules(t, text,
		"--probability 0.3333333333 -j STARLING-SEP-",
		"--probability 0.5000000000 -j STARLING-SEP-",
		"-j DNAT --to-destination 10.22.3.2:8080",
		"-s 10.22.1.2/32 -j STARLING-MARK-MASQ", // hairpin
		"! -s 10.22.0.0/16 -j STARLING-MARK-MASQ",
		"-A STARLING-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
		"-A STARLING-MARK-MASQ -j MARK --or-mark 0x4000",
		"-A STARLING-CANARY -j RETURN",
	)
	// The last endpoint is taken unconditionally (1/(n-i) with i = n-1).
	if strings.Count(text, "--probability") != 2 {
		t.Errorf("want 2 probability rules for 3 endpoints:\n%s", text)
	}
}

func TestRulesRejectServicesWithoutEndpoints(t *testing.T) {
	p := webPort()
	p.NodePort = 30080
	text := string(Rules([]Port{p}, Config{ClusterCIDR: clusterCIDR}))
	if strings.Contains(text, ":STARLING-SVC-") {
		t.Errorf("a port without endpoints got a service chain:\n%s", text)
	}
	hasRules(t, text,
		"-A STARLING-REJECT -d 10.23.0.10/32 -p tcp -m tcp --dport 80",
		"-A STARLING-REJECT -m addrtype --dst-type LOCAL -p tcp -m tcp --dport 30080",
		"REJECT --reject-with icmp-port-unreachable",
	)
}

func TestRulesMasqueradeAllMarksEveryServicePacket(t *testing.T) {
	text := string(Rules([]Port{webPort("10.22.1.2:8080")}, Config{ClusterCIDR: clusterCIDR, MasqueradeAll: true}))
	if strings.Contains(text, "! -s 10.22.0.0/16") {
		t.Error("masquerade-all must not exempt the cluster CIDR")
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "-A STARLING-SVC-") && strings.HasSuffix(line, "-j STARLING-MARK-MASQ") {
			return
		}
	}
	t.Errorf("no unconditional mark in the service chain:\n%s", text)
}

func TestRulesAreDeterministicAndChainNamesFit(t *testing.T) {
	ports := []Port{
		webPort("10.22.1.2:8080", "10.22.2.2:8080"),
		{Service: "default/dns", Name: "dns", Protocol: UDP, ClusterIP: netip.MustParseAddr("10.23.0.53"), Port: 53, Endpoints: addrPorts("10.22.1.9:53")},
	}
	a := Rules(ports, Config{ClusterCIDR: clusterCIDR})
	rev := []Port{ports[1], ports[0]}
	rev[1].Endpoints = addrPorts("10.22.2.2:8080", "10.22.1.2:8080")
	if b := Rules(rev, Config{ClusterCIDR: clusterCIDR}); string(a) != string(b) {
		t.Fatalf("input order changed the rules:\n%s\n---\n%s", a, b)
	}
	for _, c := range declaredChains(a) {
		if len(c) > 28 {
			t.Errorf("chain %s is %d characters, iptables allows 28", c, len(c))
		}
	}
	if !strings.Contains(string(a), "-p udp -m udp --dport 53") {
		t.Errorf("UDP port missing:\n%s", a)
	}
}

func TestAllocateIsDeterministicHonoursRequestsAndKeepsOlderOnConflict(t *testing.T) {
	_, cidr, _ := net.ParseCIDR("10.23.0.0/16")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	specs := []Spec{
		{Key: "default/old", Created: t0, ClusterIP: netip.MustParseAddr("10.23.0.10"), NodePort: true, Ports: []SpecPort{{Name: "a", NodePort: 30080}}},
		{Key: "default/new", Created: t0.Add(time.Hour), ClusterIP: netip.MustParseAddr("10.23.0.10"), NodePort: true, Ports: []SpecPort{{Name: "a", NodePort: 30080}}},
	}
	for i := 0; i < 200; i++ {
		specs = append(specs, Spec{Key: fmt.Sprintf("ns/s%03d", i), Created: t0, NodePort: i%2 == 0, Ports: []SpecPort{{Name: "p"}}})
	}
	a := Allocate(specs, cidr)
	if a.ClusterIPs["default/old"] != netip.MustParseAddr("10.23.0.10") || a.ClusterIPs["default/new"] == netip.MustParseAddr("10.23.0.10") {
		t.Fatalf("conflict: old %s new %s", a.ClusterIPs["default/old"], a.ClusterIPs["default/new"])
	}
	if a.NodePorts["default/old/a"] != 30080 || a.NodePorts["default/new/a"] == 30080 {
		t.Fatalf("nodePort conflict: old %d new %d", a.NodePorts["default/old/a"], a.NodePorts["default/new/a"])
	}
	ips, ports := map[netip.Addr]bool{}, map[int32]bool{}
	for k, ip := range a.ClusterIPs {
		if ips[ip] || !cidr.Contains(ip.AsSlice()) || ip.String() == "10.23.0.0" || ip.String() == "10.23.255.255" {
			t.Fatalf("%s got %s (duplicate or outside)", k, ip)
		}
		ips[ip] = true
	}
	for k, p := range a.NodePorts {
		if ports[p] || p < NodePortMin || p > NodePortMax {
			t.Fatalf("%s got nodePort %d (duplicate or outside)", k, p)
		}
		ports[p] = true
	}
	shuffled := append([]Spec(nil), specs...)
	rand.New(rand.NewSource(1)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	b := Allocate(shuffled, cidr)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("input order changed the allocation")
	}
}

// BenchmarkRules measures generating the rules for services x 5
// endpoints; it reports the number of rule lines.
func BenchmarkRules(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		ports := make([]Port, n)
		for i := range ports {
			ports[i] = Port{Service: fmt.Sprintf("default/s%d", i), Name: "http", Protocol: TCP,
				ClusterIP: netip.AddrFrom4([4]byte{10, 23, byte(i / 250), byte(i%250 + 1)}), Port: 80}
			for e := 0; e < 5; e++ {
				ports[i].Endpoints = append(ports[i].Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, byte(e), byte(i%250 + 2)}), 8080))
			}
		}
		b.Run(fmt.Sprintf("%dx5", n), func(b *testing.B) {
			var text []byte
			for i := 0; i < b.N; i++ {
				text = Rules(ports, Config{ClusterCIDR: clusterCIDR})
			}
			b.ReportMetric(float64(strings.Count(string(text), "\n-A ")), "rule-lines")
		})
	}
}

// declaredChains returns the chains a restore text declares, in order.
func declaredChains(text []byte) []string {
	var out []string
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, ":") {
			out = append(out, strings.Fields(line[1:])[0])
		}
	}
	return out
}
