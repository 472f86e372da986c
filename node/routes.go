package node

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/starling-orchestrator/starling/net/route"
	"github.com/starling-orchestrator/starling/node/view"
)

// routeResync is how often routes are checked against the kernel, so a
// route deleted by hand is back within about a second.
const routeResync = time.Second

// routeApplier installs the routes to peers' pod subnets: route.Sync
// (netlink), or the dry run's printer.
type routeApplier func([]route.Route) (route.Change, error)

// routes keeps this node's routes to its peers' pod subnets following
// the view.
type routes struct {
	self        string
	views       *view.Builder
	subnets     *subnets
	auth        *memberAuth // nil: membership's address is taken as is (tests)
	clusterCIDR netip.Prefix
	apply       routeApplier
	// ready is closed when routes may be applied (at once on a real
	// node; after its first look on a dry run); synced when this node
	// holds the cluster's state (members.synced).
	ready, synced <-chan struct{}
	log           *slog.Logger
}

// desired is a route to the pod subnet of every peer that is alive or
// suspect by membership (no flap damping: traffic follows liveness), via
// the address membership reaches it at, if the peer signed that address
// with the key of its status record (memberAuth.signedAddr; an impostor
// that got into some node's membership under the name routes nothing).
func (rt *routes) desired() []route.Route {
	v := rt.views.View()
	statuses := v.Statuses
	winners := v.Winners
	var peers []route.Peer
	for _, m := range v.Members {
		if m.Name == rt.self || !m.State.Up() {
			continue
		}
		s, ok := statuses[m.Name]
		if !ok || !s.SubnetReady || !winners[m.Name] {
			continue
		}
		subnet, err := netip.ParsePrefix(s.PodSubnet)
		if err != nil {
			continue
		}
		addr, err := netip.ParseAddr(m.Addr)
		if err != nil || (rt.auth != nil && !rt.auth.signedAddr(m, s)) {
			continue
		}
		peers = append(peers, route.Peer{Name: m.Name, Addr: addr.Unmap(), PodSubnet: subnet})
	}
	own, _ := netip.ParsePrefix(rt.subnets.current().Subnet)
	return route.Desired(own, rt.clusterCIDR, peers)
}

// loop keeps the routes to peers' pod subnets: on every membership or
// state change and every routeResync.
func (rt *routes) loop(ctx context.Context) {
	if rt.apply == nil {
		return
	}
	// The first apply replaces the routes an earlier run left (the
	// kernel kept them): from a view built once this node holds the
	// cluster's state. One built before the join's sync holds no live
	// peer, and removed every route to their pods for as long as the
	// join took (requests to Service endpoints there timed out across
	// an agent restart).
	for _, ch := range []<-chan struct{}{rt.ready, rt.synced} {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
	rt.views.Rebuild(time.Now())
	tick := time.NewTicker(routeResync)
	defer tick.Stop()
	for {
		changed := rt.views.Changed()
		ch, err := rt.apply(rt.desired())
		if err != nil {
			rt.log.Warn("sync routes", "err", err)
		}
		if len(ch.Added) > 0 || len(ch.Removed) > 0 {
			rt.log.Info("routes synced", "added", ch.Added, "removed", ch.Removed)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-changed:
		}
	}
}

// closed is a closed channel: "ready now".
func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
