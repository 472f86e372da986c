package dataplane

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/net/route"
	"github.com/starling-orchestrator/starling/node/view"
)

// routeResync is how often routes are checked against the kernel, so a
// route deleted by hand is back within about a second.
const routeResync = time.Second

// Views is what a dataplane controller reads of the cluster view
// (view.Builder): the latest view, a channel closed when a newer one is
// stored, and a rebuild at once (before a first apply).
type Views interface {
	View() *view.View
	Changed() <-chan struct{}
	Rebuild(now time.Time)
}

// RouteApplier installs the routes to peers' pod subnets and reports
// what changed: route.Sync (netlink), or a dry run's printer.
type RouteApplier func([]route.Route) (route.Change, error)

// Subnet is this node's own pod subnet (the node's claim; invalid
// before it claimed one).
type Subnet interface {
	Own() netip.Prefix
}

// Addresses judges the address membership gives a peer: whether the
// peer signed it with the key of its status record s (node's member
// authentication).
type Addresses interface {
	SignedAddr(m gossip.Member, s view.NodeStatus) bool
}

// RoutesConfig is what Routes is made of. Addresses may be nil (tests:
// membership's address is taken as is); every other field is required.
type RoutesConfig struct {
	Self        string
	Views       Views
	Subnet      Subnet
	Addresses   Addresses
	ClusterCIDR netip.Prefix
	Apply       RouteApplier
	// Ready is closed when routes may be applied (at once on a real
	// node; after its first look on a dry run); Synced when this node
	// holds the cluster's state.
	Ready, Synced <-chan struct{}
	Log           *slog.Logger
}

// Routes keeps this node's routes to its peers' pod subnets following
// the view.
type Routes struct {
	cfg RoutesConfig
}

// NewRoutes returns the routes controller of c.
func NewRoutes(c RoutesConfig) *Routes { return &Routes{cfg: c} }

// Desired is a route to the pod subnet of every peer that is alive or
// suspect by membership (no flap damping: traffic follows liveness) and
// whose subnet claim wins, via the address membership reaches it at, if
// the peer signed that address with the key of its status record
// (Addresses; an impostor that got into some node's membership under
// the name routes nothing). A pure function of the view and this node's
// subnet (route.Desired).
func Desired(v *view.View, self string, own, clusterCIDR netip.Prefix, addrs Addresses) []route.Route {
	var peers []route.Peer
	for _, m := range v.Members {
		if m.Name == self || !m.State.Up() {
			continue
		}
		s, ok := v.Statuses[m.Name]
		if !ok || !s.SubnetReady || !v.Winners[m.Name] {
			continue
		}
		subnet, err := netip.ParsePrefix(s.PodSubnet)
		if err != nil {
			continue
		}
		addr, err := netip.ParseAddr(m.Addr)
		if err != nil || (addrs != nil && !addrs.SignedAddr(m, s)) {
			continue
		}
		peers = append(peers, route.Peer{Name: m.Name, Addr: addr.Unmap(), PodSubnet: subnet})
	}
	return route.Desired(own, clusterCIDR, peers)
}

// Run keeps the routes to peers' pod subnets: on every view and every
// routeResync, until ctx ends. With no applier it returns at once.
func (rt *Routes) Run(ctx context.Context) {
	c := rt.cfg
	if c.Apply == nil {
		return
	}
	// The first apply replaces the routes an earlier run left (the
	// kernel kept them): from a view built once this node holds the
	// cluster's state. One built before the join's sync holds no live
	// peer, and removed every route to their pods for as long as the
	// join took (requests to Service endpoints there timed out across
	// an agent restart).
	for _, ch := range []<-chan struct{}{c.Ready, c.Synced} {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
	c.Views.Rebuild(time.Now())
	tick := time.NewTicker(routeResync)
	defer tick.Stop()
	for {
		changed := c.Views.Changed()
		ch, err := c.Apply(Desired(c.Views.View(), c.Self, c.Subnet.Own(), c.ClusterCIDR, c.Addresses))
		if err != nil {
			c.Log.Warn("sync routes", "err", err)
		}
		if len(ch.Added) > 0 || len(ch.Removed) > 0 {
			c.Log.Info("routes synced", "added", ch.Added, "removed", ch.Removed)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-changed:
		}
	}
}
