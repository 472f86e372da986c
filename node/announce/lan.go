package announce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// LAN is the Link of a real node: the interface that holds the node's own
// address (--advertise), in the agent's network namespace. The addresses
// it adds are /32s; it keeps their list in a file (State) so that the
// next run takes off what a killed one left, before it announces
// anything. On the first Add it sets, on that interface only,
// arp_ignore=1 (answer ARP only for addresses of the interface asked
// on) and arp_announce=2 (never give a LoadBalancer address as the
// source of this node's own ARP requests, which would keep LAN hosts'
// caches pointing here after the address moved away): see
// docs/real-hosts.md and the kernel's ip-sysctl.rst.
type LAN struct {
	self  netip.Addr
	state string

	mu     sync.Mutex
	arp    *arp.Client
	ifname string
	set    bool // the sysctls were set
}

// NewLAN returns the LAN link of the interface that holds self, keeping
// its list of addresses in the file state, and takes off the addresses
// that list holds (an earlier run's).
func NewLAN(self netip.Addr, state string) (*LAN, error) {
	l := &LAN{self: self, state: state}
	b, err := os.ReadFile(state)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var errs []error
	for _, f := range strings.Fields(string(b)) {
		if a, err := netip.ParseAddr(f); err == nil && a != self {
			errs = append(errs, l.Remove(a))
		}
	}
	return l, errors.Join(errs...)
}

// link returns the interface that holds l.self and the prefix it holds it
// with (the LAN's subnet).
func (l *LAN) link() (netlink.Link, netip.Prefix, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, netip.Prefix{}, err
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || ip != l.self {
			continue
		}
		ones, _ := a.Mask.Size()
		link, err := netlink.LinkByIndex(a.LinkIndex)
		return link, netip.PrefixFrom(ip, ones).Masked(), err
	}
	return nil, netip.Prefix{}, fmt.Errorf("no interface holds this node's address %s", l.self)
}

// Held lists the IPv4 addresses of the LAN interface but the node's own.
func (l *LAN) Held() ([]netip.Addr, error) {
	link, _, err := l.link()
	if err != nil {
		return nil, err
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip != l.self {
			out = append(out, ip)
		}
	}
	return out, nil
}

// Add puts a on the LAN interface as a /32, if the interface's subnet
// holds it (a LoadBalancer address outside the LAN would be announced to
// no one: refused, with the subnet in the error).
func (l *LAN) Add(a netip.Addr) error {
	link, subnet, err := l.link()
	if err != nil {
		return err
	}
	if !subnet.Contains(a) || a == subnet.Addr() {
		return fmt.Errorf("%s is not an address of the LAN %s of interface %s: set a pool inside it (starling cluster lb-pool CIDR)", a, subnet, link.Attrs().Name)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.arpSysctls(link.Attrs().Name); err != nil {
		return err
	}
	if err := l.record(a, true); err != nil {
		return err
	}
	err = netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	if errors.Is(err, syscall.EEXIST) {
		err = nil
	}
	return err
}

// Remove takes a off the LAN interface.
func (l *LAN) Remove(a netip.Addr) error {
	link, _, err := l.link()
	if err != nil {
		return err
	}
	err = netlink.AddrDel(link, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	if errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESRCH) {
		err = nil
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.record(a, false)
}

// Announce sends a gratuitous ARP reply for a to the LAN's broadcast
// address (sender and target a, at this interface's hardware address),
// which makes hosts that cache a point it here (RFC 5227, section 3).
func (l *LAN) Announce(a netip.Addr) error {
	link, _, err := l.link()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.arp == nil || l.ifname != link.Attrs().Name {
		ifi, err := net.InterfaceByName(link.Attrs().Name)
		if err != nil {
			return err
		}
		c, err := arp.Dial(ifi)
		if err != nil {
			return fmt.Errorf("arp on %s: %w", ifi.Name, err)
		}
		if l.arp != nil {
			l.arp.Close()
		}
		l.arp, l.ifname = c, ifi.Name
	}
	p, err := arp.NewPacket(arp.OperationReply, l.arp.HardwareAddr(), a, ethernet.Broadcast, a)
	if err != nil {
		return err
	}
	return l.arp.WriteTo(p, ethernet.Broadcast)
}

// arpSysctls sets arp_ignore and arp_announce on interface name, once
// (l.mu held).
func (l *LAN) arpSysctls(name string) error {
	if l.set {
		return nil
	}
	for k, v := range map[string]string{"arp_ignore": "1", "arp_announce": "2"} {
		if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv4/conf", name, k), []byte(v), 0o644); err != nil {
			return fmt.Errorf("set %s on %s: %w", k, name, err)
		}
	}
	l.set = true
	return nil
}

// record adds a to (or takes it off) the state file's list, written
// before the address goes on and after it comes off (l.mu held).
func (l *LAN) record(a netip.Addr, on bool) error {
	b, err := os.ReadFile(l.state)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	list := strings.Fields(string(b))
	list = slices.DeleteFunc(list, func(s string) bool { return s == a.String() })
	if on {
		list = append(list, a.String())
	}
	tmp := l.state + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(list, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	return unix.Rename(tmp, l.state)
}
