package podnet

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// readdressBridge gives the node bridge, if it exists, gw (the pod
// subnet's gateway, with the subnet's prefix length) as its only IPv4
// address. The CNI bridge plugin sets the gateway address when it
// attaches a pod, but a node whose subnet moved must drop the old one at
// once: its connected route would keep the old subnet on this node, in
// the way of the route to the node that holds it now.
func readdressBridge(name string, gw *net.IPNet) error {
	br, err := netlink.LinkByName(name)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil // no pod attached yet: the plugin creates it with gw
	}
	if err != nil {
		return fmt.Errorf("bridge %s: %w", name, err)
	}
	addrs, err := netlink.AddrList(br, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("bridge %s addresses: %w", name, err)
	}
	has := false
	for _, a := range addrs {
		if a.IPNet.String() == gw.String() {
			has = true
			continue
		}
		if err := netlink.AddrDel(br, &a); err != nil {
			return fmt.Errorf("bridge %s: remove old address %s: %w", name, a.IPNet, err)
		}
	}
	if has {
		return nil
	}
	if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: gw}); err != nil {
		return fmt.Errorf("bridge %s: add address %s: %w", name, gw, err)
	}
	return nil
}
