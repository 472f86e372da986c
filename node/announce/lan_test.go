package announce

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLANAddressRefusesNetworkAndBroadcast: an address goes on the LAN
// interface only if its subnet holds it and it is neither the subnet's
// network nor its broadcast address (which a record could ask for).
func TestLANAddressRefusesNetworkAndBroadcast(t *testing.T) {
	cases := []struct {
		subnet, addr string
		want         bool
	}{
		{"192.168.1.0/24", "192.168.1.240", true},
		{"192.168.1.0/24", "192.168.1.0", false},
		{"192.168.1.0/24", "192.168.1.255", false},
		{"192.168.1.0/24", "192.168.2.7", false},
		{"10.0.0.0/8", "10.255.255.255", false},
		{"192.168.1.0/31", "192.168.1.1", true},
		{"192.168.1.0/24", "fd00::1", false},
	}
	for _, c := range cases {
		if got := lanAddress(netip.MustParsePrefix(c.subnet), netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("%s on %s: %v, want %v", c.addr, c.subnet, got, c.want)
		}
	}
}

// TestLANRestoresARPSysctls: the ARP sysctls are saved before they are
// set, set on the new interface (and restored on the old) when the LAN
// interface changes, restored when the last address comes off, and a
// run after a crash restores the host's values, not the ones it set.
func TestLANRestoresARPSysctls(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "conf")
	for _, ifname := range []string{"eth0", "eth1"} {
		os.MkdirAll(filepath.Join(conf, ifname), 0o755)
		os.WriteFile(filepath.Join(conf, ifname, "arp_ignore"), []byte("0\n"), 0o644)
		os.WriteFile(filepath.Join(conf, ifname, "arp_announce"), []byte("1\n"), 0o644)
	}
	read := func(ifname string) string {
		a, _ := os.ReadFile(filepath.Join(conf, ifname, "arp_ignore"))
		b, _ := os.ReadFile(filepath.Join(conf, ifname, "arp_announce"))
		return strings.TrimSpace(string(a)) + "," + strings.TrimSpace(string(b))
	}
	state := filepath.Join(dir, "lb-addresses")
	l := &LAN{state: state, sysctls: conf}
	addr := netip.MustParseAddr("192.168.1.240")
	if err := l.arpSysctls("eth0"); err != nil {
		t.Fatal(err)
	}
	l.record(addr, true)
	if read("eth0") != "1,2" {
		t.Fatalf("eth0 after the first address: %s, want 1,2", read("eth0"))
	}
	if err := l.arpSysctls("eth1"); err != nil {
		t.Fatal(err)
	}
	if read("eth0") != "0,1" || read("eth1") != "1,2" {
		t.Errorf("after a move to eth1: eth0 %s (want 0,1 restored), eth1 %s (want 1,2)", read("eth0"), read("eth1"))
	}
	// A crash, then a new run: it finds eth1's saved values and keeps them.
	l2 := &LAN{state: state, sysctls: conf}
	if err := l2.arpSysctls("eth1"); err != nil {
		t.Fatal(err)
	}
	if err := l2.record(addr, false); err != nil {
		t.Fatal(err)
	}
	if read("eth1") != "0,1" {
		t.Errorf("the last address off: eth1 %s, want the host's 0,1", read("eth1"))
	}
	if _, err := os.Stat(state + ".sysctl"); !os.IsNotExist(err) {
		t.Errorf("saved values kept after the restore: %v", err)
	}
}
