// Package route keeps a node's routes to its peers' pod subnets: one route
// "<peer pod subnet> via <peer address>" for every live peer, marked with
// Starling's own route protocol number so that only Starling's routes are
// ever touched (see rtnetlink(7), rtm_protocol; numbers above 4 are free
// for routing daemons, /etc/iproute2/rt_protos).
//
// Desired is pure; Sync reads the kernel's routes and applies the
// difference, and is cheap enough to run every second, which repairs a
// route deleted by hand.
package route

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"

	"github.com/vishvananda/netlink"
)

// Protocol marks Starling's routes ("proto 87" in `ip route`).
const Protocol netlink.RouteProtocol = 87

// Peer is a live member with a pod subnet, as parsed values.
type Peer struct {
	Name      string
	Addr      netip.Addr   // the peer's node address, on-link
	PodSubnet netip.Prefix // the peer's pod subnet (a /24)
}

// Route is one desired route: via a gateway, or straight to a device.
type Route struct {
	Dst *net.IPNet
	Via net.IP
	Dev string // when set (and Via nil): "Dst dev Dev scope link"
}

func (r Route) String() string {
	if r.Dev != "" {
		return r.Dst.String() + " dev " + r.Dev
	}
	return r.Dst.String() + " via " + r.Via.String()
}

// Desired returns the routes to every peer's subnet except self's own
// (own is this node's subnet, served by its bridge), sorted by
// destination. Only IPv4 subnets that are networks (no host bits) inside
// cluster (--cluster-cidr) and smaller than it are routed: a peer's
// claim of any other range (8.8.8.0/24, the LAN, the whole cluster) would
// hijack traffic that is not pod traffic. Peers without a valid address
// or subnet, whose subnet overlaps own, or whose address lies inside
// cluster (a gateway must be a node address) are skipped too; of two
// peers with one subnet, or overlapping ones, the first keeps it (the
// claim layer resolves conflicts before this: a more specific route must
// never take part of another node's subnet).
func Desired(own netip.Prefix, cluster netip.Prefix, peers []Peer) []Route {
	var out []Route
	var seen []netip.Prefix
	for _, p := range peers {
		sub := p.PodSubnet
		if !p.Addr.Is4() || !sub.IsValid() || !sub.Addr().Is4() || sub != sub.Masked() {
			continue
		}
		if !cluster.IsValid() || sub.Bits() <= cluster.Bits() || !cluster.Contains(sub.Addr()) || cluster.Contains(p.Addr) {
			continue
		}
		if own.IsValid() && own.Overlaps(sub) {
			continue
		}
		if slices.ContainsFunc(seen, sub.Overlaps) {
			continue
		}
		seen = append(seen, sub)
		out = append(out, Route{Dst: ipNet(sub), Via: net.IP(p.Addr.AsSlice())})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dst.String() < out[j].Dst.String() })
	return out
}

// ipNet converts a parsed prefix for netlink.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Change is what Sync did.
type Change struct {
	Added, Removed []string
}

// Sync makes the kernel's Starling routes (main table, IPv4) equal to
// want: missing or different ones are replaced, extra ones deleted. It
// touches no route of another protocol. Errors name the route.
func Sync(want []Route) (Change, error) {
	var ch Change
	have, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: Protocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return ch, fmt.Errorf("list routes: %w", err)
	}
	current := map[string]netlink.Route{}
	for _, r := range have {
		if r.Dst != nil {
			current[r.Dst.String()] = r
		}
	}
	wanted := map[string]bool{}
	for _, w := range want {
		key := w.Dst.String()
		nr := &netlink.Route{Dst: w.Dst, Gw: w.Via, Protocol: Protocol}
		if w.Dev != "" {
			link, err := netlink.LinkByName(w.Dev)
			if err != nil {
				continue // the device comes later (the bridge, with the first pod)
			}
			nr = &netlink.Route{Dst: w.Dst, LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK, Protocol: Protocol}
		}
		wanted[key] = true
		if r, ok := current[key]; ok && r.Gw.Equal(nr.Gw) && (w.Dev == "" || r.LinkIndex == nr.LinkIndex) {
			continue
		}
		if err := netlink.RouteReplace(nr); err != nil {
			return ch, fmt.Errorf("route %s: %w", w, err)
		}
		ch.Added = append(ch.Added, w.String())
	}
	for key, r := range current {
		if wanted[key] {
			continue
		}
		if err := netlink.RouteDel(&r); err != nil {
			return ch, fmt.Errorf("delete route %s: %w", key, err)
		}
		ch.Removed = append(ch.Removed, key)
	}
	sort.Strings(ch.Removed)
	return ch, nil
}
