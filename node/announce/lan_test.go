package announce

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
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

// TestLANTouchesOnlyItsOwnAddresses (root, in a network namespace of its
// own): an address the interface held already is refused with ErrExists
// and never listed, recorded nor taken off; the subnet's broadcast
// address is refused; the LAN lists and removes what it added.
func TestLANTouchesOnlyItsOwnAddresses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace)")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare: %v", err)
			return
		}
		lanOwnAddresses(t)
	}()
	<-done
}

func lanOwnAddresses(t *testing.T) {
	dummy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lan0"}, PeerName: "lan1"} // the dummy module may be missing
	if err := netlink.LinkAdd(dummy); err != nil {
		t.Errorf("veth link: %v", err)
		return
	}
	netlink.LinkSetUp(dummy)
	self, host := netip.MustParseAddr("192.168.50.11"), netip.MustParseAddr("192.168.50.240")
	for _, a := range []string{"192.168.50.11/24", "192.168.50.240/32"} {
		addr, _ := netlink.ParseAddr(a)
		if err := netlink.AddrAdd(dummy, addr); err != nil {
			t.Errorf("%s: %v", a, err)
			return
		}
	}
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "conf", "lan0"), 0o755)
	for _, k := range []string{"arp_ignore", "arp_announce"} {
		os.WriteFile(filepath.Join(dir, "conf", "lan0", k), []byte("0"), 0o644)
	}
	l, err := NewLAN(self, filepath.Join(dir, "lb-addresses"))
	if err != nil {
		t.Errorf("NewLAN: %v", err)
		return
	}
	l.sysctls = filepath.Join(dir, "conf")
	if err := l.Add(host); !errors.Is(err, ErrExists) {
		t.Errorf("Add of the host's %v: %v, want ErrExists", host, err)
	}
	if err := l.Add(netip.MustParseAddr("192.168.50.255")); err == nil {
		t.Errorf("Add of the broadcast address: no error")
	}
	mine := netip.MustParseAddr("192.168.50.241")
	if err := l.Add(mine); err != nil {
		t.Errorf("Add %v: %v", mine, err)
	}
	held, err := l.Held()
	if err != nil || !slices.Equal(held, []netip.Addr{mine}) {
		t.Errorf("Held: %v, %v; want only %v", held, err, mine)
	}
	// A new run (NewLAN) takes off what the list holds: its own, not the host's.
	if _, err := NewLAN(self, filepath.Join(dir, "lb-addresses")); err != nil {
		t.Errorf("NewLAN again: %v", err)
	}
	addrs, _ := netlink.AddrList(dummy, netlink.FAMILY_V4)
	var on []string
	for _, a := range addrs {
		on = append(on, a.IP.String())
	}
	if !slices.Contains(on, host.String()) || slices.Contains(on, mine.String()) {
		t.Errorf("after a restart the interface holds %v: want the host's %v kept, %v off", on, host, mine)
	}
}
