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
	"sort"

	"github.com/vishvananda/netlink"
)

// Protocol marks Starling's routes ("proto 87" in `ip route`).
const Protocol netlink.RouteProtocol = 87

// Peer is a live member with a pod subnet.
type Peer struct {
	Name      string
	Addr      net.IP     // the peer's node address, on-link
	PodSubnet *net.IPNet // the peer's /24
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
// destination. Peers without an address or subnet, or whose subnet
// overlaps own, are skipped: routing them would hijack local traffic.
func Desired(own *net.IPNet, peers []Peer) []Route {
	var out []Route
	seen := map[string]bool{}
	for _, p := range peers {
		if p.Addr == nil || p.PodSubnet == nil {
			continue
		}
		if own != nil && (own.Contains(p.PodSubnet.IP) || p.PodSubnet.Contains(own.IP)) {
			continue
		}
		key := p.PodSubnet.String()
		if seen[key] {
			continue // two peers claim one subnet: the claim layer resolves it
		}
		seen[key] = true
		out = append(out, Route{Dst: p.PodSubnet, Via: p.Addr})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dst.String() < out[j].Dst.String() })
	return out
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
