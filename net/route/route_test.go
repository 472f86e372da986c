package route

import (
	"net"
	"testing"
)

func cidr(s string) *net.IPNet { _, n, _ := net.ParseCIDR(s); return n }

func TestDesiredRoutesToEveryPeerSubnetButOwn(t *testing.T) {
	own := cidr("10.22.1.0/24")
	peers := []Peer{
		{Name: "c", Addr: net.ParseIP("192.168.1.13"), PodSubnet: cidr("10.22.3.0/24")},
		{Name: "b", Addr: net.ParseIP("192.168.1.12"), PodSubnet: cidr("10.22.2.0/24")},
		{Name: "self-dup", Addr: net.ParseIP("192.168.1.99"), PodSubnet: cidr("10.22.1.0/24")},
		{Name: "no-subnet", Addr: net.ParseIP("192.168.1.14")},
		{Name: "dup", Addr: net.ParseIP("192.168.1.15"), PodSubnet: cidr("10.22.2.0/24")},
	}
	got := Desired(own, peers)
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
