package route

import (
	"net/netip"
	"testing"
)

func cidr(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr   { return netip.MustParseAddr(s) }

func TestDesiredRoutesToEveryPeerSubnetButOwn(t *testing.T) {
	own := cidr("10.22.1.0/24")
	peers := []Peer{
		{Name: "c", Addr: addr("192.168.1.13"), PodSubnet: cidr("10.22.3.0/24")},
		{Name: "b", Addr: addr("192.168.1.12"), PodSubnet: cidr("10.22.2.0/24")},
		{Name: "self-dup", Addr: addr("192.168.1.99"), PodSubnet: cidr("10.22.1.0/24")},
		{Name: "no-subnet", Addr: addr("192.168.1.14")},
		{Name: "dup", Addr: addr("192.168.1.15"), PodSubnet: cidr("10.22.2.0/24")},
	}
	got := Desired(own, cidr("10.22.0.0/16"), peers)
	want := []string{"10.22.2.0/24 via 192.168.1.12", "10.22.3.0/24 via 192.168.1.13"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("route %d = %s, want %s", i, got[i], want[i])
		}
	}
}

// A peer may claim only a pod subnet inside --cluster-cidr: a claim of a
// public range, of the LAN, of the whole cluster or with host bits set
// must never become a route (a hostile claim of 8.8.8.0/24 once became
// "8.8.8.0/24 via <writer>" on every node).
func TestDesiredRoutesOnlyInsideClusterCIDR(t *testing.T) {
	cluster := cidr("10.22.0.0/16")
	peers := []Peer{
		{Name: "public", Addr: addr("192.168.1.20"), PodSubnet: cidr("8.8.8.0/24")},
		{Name: "lan", Addr: addr("192.168.1.21"), PodSubnet: cidr("192.168.1.0/24")},
		{Name: "whole", Addr: addr("192.168.1.22"), PodSubnet: cidr("10.22.0.0/16")},
		{Name: "wider", Addr: addr("192.168.1.23"), PodSubnet: cidr("10.0.0.0/8")},
		{Name: "hostbits", Addr: addr("192.168.1.24"), PodSubnet: netip.PrefixFrom(addr("10.22.5.7"), 24)},
		{Name: "gw-in-cluster", Addr: addr("10.22.9.1"), PodSubnet: cidr("10.22.9.0/24")},
		{Name: "v6", Addr: addr("fe80::1"), PodSubnet: cidr("10.22.8.0/24")},
		{Name: "zero"},
		{Name: "good", Addr: addr("192.168.1.25"), PodSubnet: cidr("10.22.7.0/24")},
		{Name: "inside-good", Addr: addr("192.168.1.26"), PodSubnet: cidr("10.22.7.16/28")},
	}
	got := Desired(cidr("10.22.1.0/24"), cluster, peers)
	if len(got) != 1 || got[0].String() != "10.22.7.0/24 via 192.168.1.25" {
		t.Fatalf("got %v, want only 10.22.7.0/24 via 192.168.1.25", got)
	}
	if got := Desired(netip.Prefix{}, netip.Prefix{}, peers); len(got) != 0 {
		t.Fatalf("with no cluster CIDR nothing may be routed, got %v", got)
	}
}
