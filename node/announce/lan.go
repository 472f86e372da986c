package announce

import (
	"encoding/binary"
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
// anything, and it lists (Held) and takes off only those: an address
// that was on the interface already (the host's own) is refused
// (ErrExists), never recorded. While it holds an address it sets, on
// that interface only, arp_ignore=1 (answer ARP only for addresses of
// the interface asked on) and arp_announce=2 (never give a LoadBalancer
// address as the source of this node's own ARP requests, which would
// keep LAN hosts' caches pointing here after the address moved away):
// see docs/real-hosts.md and the kernel's ip-sysctl.rst. It saves their
// values before (in State + ".sysctl") and puts them back when it holds
// no address on that interface any more, or moves to another one.
type LAN struct {
	self  netip.Addr
	state string
	// sysctls is the directory of the interfaces' IPv4 sysctls
	// (/proc/sys/net/ipv4/conf; a temporary one in tests).
	sysctls string

	mu     sync.Mutex
	arp    *arp.Client
	ifname string
}

// ErrExists is what Add returns (wrapped) for an address that is on the
// interface already and that this agent did not put there.
var ErrExists = errors.New("already on the interface, not put there by Starling")

// NewLAN returns the LAN link of the interface that holds self, keeping
// its list of addresses in the file state, and takes off the addresses
// that list holds (an earlier run's).
func NewLAN(self netip.Addr, state string) (*LAN, error) {
	l := &LAN{self: self, state: state, sysctls: "/proc/sys/net/ipv4/conf"}
	list, err := l.recorded()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, a := range list {
		if a != self {
			errs = append(errs, l.Remove(a))
		}
	}
	if len(list) == 0 { // else the last Remove did
		l.mu.Lock()
		errs = append(errs, l.restoreSysctls())
		l.mu.Unlock()
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

// Held lists the addresses this agent put on the LAN interface (its
// state file's) that are on it: never the node's own, nor any other
// address the host holds.
func (l *LAN) Held() ([]netip.Addr, error) {
	link, _, err := l.link()
	if err != nil {
		return nil, err
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	ours, err := l.recorded()
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip != l.self && slices.Contains(ours, ip) {
			out = append(out, ip)
		}
	}
	return out, nil
}

// lanAddress reports whether a may go on an interface of subnet: inside
// it, and neither its network nor (wider than /31) its broadcast address.
func lanAddress(subnet netip.Prefix, a netip.Addr) bool {
	if !a.Is4() || !subnet.Contains(a) || a == subnet.Addr() {
		return false
	}
	if subnet.Bits() >= 31 {
		return true
	}
	b := subnet.Masked().Addr().As4()
	binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])|^uint32(0)>>subnet.Bits())
	return a != netip.AddrFrom4(b)
}

// Add puts a on the LAN interface as a /32, if the interface's subnet
// holds it (a LoadBalancer address outside the LAN would be announced to
// no one: refused, with the subnet in the error).
func (l *LAN) Add(a netip.Addr) error {
	link, subnet, err := l.link()
	if err != nil {
		return err
	}
	if !lanAddress(subnet, a) {
		return fmt.Errorf("%s is not a host address of the LAN %s of interface %s (not its network or broadcast address): set a pool inside it (starling cluster lb-pool CIDR)", a, subnet, link.Attrs().Name)
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
		// Not ours: off the list again (a later Remove, NewLAN or the
		// fence watchdog would take the host's address off).
		return errors.Join(fmt.Errorf("%s on %s: %w", a, link.Attrs().Name, ErrExists), l.record(a, false))
	}
	if err != nil {
		return errors.Join(err, l.record(a, false))
	}
	return nil
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

// arpValues are the sysctls LAN sets on its interface, and their values.
var arpValues = [][2]string{{"arp_ignore", "1"}, {"arp_announce", "2"}}

// arpSysctls sets arpValues on interface name, after saving the values
// they had (l.mu held). The saved values are kept until restored: a run
// after a crash finds them and keeps them (they are the host's, not the
// ones it set). Moving to another interface restores the first one's.
func (l *LAN) arpSysctls(name string) error {
	saved, err := os.ReadFile(l.state + ".sysctl")
	switch {
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return err
	case err == nil && strings.HasPrefix(string(saved), name+" "):
		return l.writeSysctls(name, arpValues) // set again: cheap, and a change by hand undone
	case err == nil:
		if err := l.restoreSysctls(); err != nil {
			return err
		}
	}
	line := name
	for _, kv := range arpValues {
		b, err := os.ReadFile(filepath.Join(l.sysctls, name, kv[0]))
		if err != nil {
			return fmt.Errorf("read %s of %s: %w", kv[0], name, err)
		}
		line += " " + kv[0] + "=" + strings.TrimSpace(string(b))
	}
	if err := writeAtomic(l.state+".sysctl", line+"\n"); err != nil {
		return err
	}
	return l.writeSysctls(name, arpValues)
}

// restoreSysctls puts back the values arpSysctls saved, if any, and
// forgets them (l.mu held).
func (l *LAN) restoreSysctls() error {
	saved, err := os.ReadFile(l.state + ".sysctl")
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	f := strings.Fields(string(saved))
	if len(f) == 0 {
		return os.Remove(l.state + ".sysctl")
	}
	var kvs [][2]string
	for _, s := range f[1:] {
		if k, v, ok := strings.Cut(s, "="); ok && slices.ContainsFunc(arpValues, func(kv [2]string) bool { return kv[0] == k }) {
			kvs = append(kvs, [2]string{k, v})
		}
	}
	if err := l.writeSysctls(f[0], kvs); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err // an interface gone has no sysctls left to restore
	}
	return os.Remove(l.state + ".sysctl")
}

// writeSysctls writes each of kvs (name, value) for interface name.
func (l *LAN) writeSysctls(name string, kvs [][2]string) error {
	for _, kv := range kvs {
		if err := os.WriteFile(filepath.Join(l.sysctls, name, kv[0]), []byte(kv[1]), 0o644); err != nil {
			return fmt.Errorf("set %s on %s: %w", kv[0], name, err)
		}
	}
	return nil
}

// recorded returns the state file's list (l.mu held, or before l is
// shared).
func (l *LAN) recorded() ([]netip.Addr, error) {
	b, err := os.ReadFile(l.state)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var out []netip.Addr
	for _, f := range strings.Fields(string(b)) {
		if a, err := netip.ParseAddr(f); err == nil {
			out = append(out, a)
		}
	}
	return out, nil
}

// record adds a to (or takes it off) the state file's list, written
// before the address goes on and after it comes off; when the list is
// left empty, the ARP sysctls are restored (l.mu held).
func (l *LAN) record(a netip.Addr, on bool) error {
	list, err := l.recorded()
	if err != nil {
		return err
	}
	list = slices.DeleteFunc(list, func(b netip.Addr) bool { return a == b })
	if on {
		list = append(list, a)
	}
	var text strings.Builder
	for _, b := range list {
		text.WriteString(b.String() + "\n")
	}
	if err := writeAtomic(l.state, text.String()); err != nil {
		return err
	}
	if len(list) == 0 {
		return l.restoreSysctls()
	}
	return nil
}

// writeAtomic replaces the file at path with text (a temporary file
// renamed over it).
func writeAtomic(path, text string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		return err
	}
	return unix.Rename(tmp, path)
}
