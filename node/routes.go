package node

import (
	"context"
	"net/netip"
	"time"

	"github.com/starling-orchestrator/starling/net/route"
)

// routeResync is how often routes are checked against the kernel, so a
// route deleted by hand is back within about a second.
const routeResync = time.Second

// desiredRoutes is a route to the pod subnet of every peer that is alive
// or suspect by membership (no flap damping: traffic follows liveness),
// via the address membership reaches it at.
func (a *Agent) desiredRoutes() []route.Route {
	v := a.view()
	statuses := v.statuses
	winners := winningClaims(statuses)
	var peers []route.Peer
	for _, m := range v.members {
		if m.Name == a.cfg.Name || !m.State.Up() {
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
		if err != nil {
			continue
		}
		peers = append(peers, route.Peer{Name: m.Name, Addr: addr.Unmap(), PodSubnet: subnet})
	}
	own, _ := netip.ParsePrefix(a.currentClaim().Subnet)
	return route.Desired(own, a.clusterCIDR, peers)
}

// routeLoop keeps the routes to peers' pod subnets: on every membership
// or state change and every routeResync.
func (a *Agent) routeLoop(ctx context.Context) {
	if a.syncRoutes == nil {
		return
	}
	tick := time.NewTicker(routeResync)
	defer tick.Stop()
	for {
		changed := a.views.changed()
		ch, err := a.syncRoutes(a.desiredRoutes())
		if err != nil {
			a.log.Warn("sync routes", "err", err)
		}
		if len(ch.Added) > 0 || len(ch.Removed) > 0 {
			a.log.Info("routes synced", "added", ch.Added, "removed", ch.Removed)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-changed:
		}
	}
}
