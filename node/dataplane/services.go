package dataplane

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/net/service"
)

// RuleSyncer applies Service rules: service.Syncer, or the dry run's
// printer. Sync is given every port, SyncServices the ports of the
// Services that changed (and every port, on demand, for a full sync);
// both report whether they wrote anything.
type RuleSyncer interface {
	Sync(ctx context.Context, ports []service.Port, cfg service.Config) (bool, error)
	SyncServices(ctx context.Context, changed map[string][]service.Port, all func() []service.Port, cfg service.Config) (bool, error)
}

// ServiceViews is what Services reads of the cluster view
// (view.Builder): Views, and the Services whose ports changed.
type ServiceViews interface {
	Views
	TakeServiceChanges() (keys []string, all bool)
}

// ServicesConfig is what Services is made of; every field is required
// but Rules (none: Run returns at once).
type ServicesConfig struct {
	Views       ServiceViews
	ClusterCIDR netip.Prefix
	// Subnet is this node's pod subnet: the endpoints of a LoadBalancer
	// Service with externalTrafficPolicy Local that this node may use
	// (nil: none).
	Subnet Subnet
	Rules  RuleSyncer
	// Ready is closed when rules may be applied (the pod network is up);
	// Synced when this node holds the cluster's state.
	// Until both, the rules the previous agent run programmed stay as
	// they are: a first sync on a view from before the join's push/pull
	// (this node the only live member) programmed every Service with
	// only its local endpoints, or none, and refused connections.
	Ready, Synced <-chan struct{}
	// BridgeNF reports whether bridged traffic passes netfilter
	// (BridgeNFOn on a real node).
	BridgeNF func() bool
	Log      *slog.Logger
}

// Services keeps this node's Service rules following the view. It owns
// its state.
type Services struct {
	cfg           ServicesConfig
	masqueradeAll bool // owned by Run
}

// NewServices returns the Service rules controller of c.
func NewServices(c ServicesConfig) *Services { return &Services{cfg: c} }

// Run keeps the Service rules: after a change (debounced 100 ms) and
// every second, when the canary shows the rules were flushed; until ctx
// ends.
func (sv *Services) Run(ctx context.Context) {
	if sv.cfg.Rules == nil {
		return
	}
	for _, ch := range []<-chan struct{}{sv.cfg.Ready, sv.cfg.Synced} {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
	// The first sync replaces the rules an earlier run left (which the
	// kernel kept): from a view built now, after the join's sync, not
	// one built before it, which held this node alone as live and so
	// its peers' endpoints as gone (the Service empty: refused).
	sv.cfg.Views.Rebuild(time.Now())
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		changed := sv.cfg.Views.Changed()
		sv.Sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-changed:
			select { // debounce: at most one sync per 100 ms
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// Sync brings the rules to the current view: the Services noted as
// changed since the last pass, or every port (the first view, or when
// the syncer finds a full sync due). Call it after taking the channel of
// the next view (view.Builder.Changed), so a view stored meanwhile wakes the
// next pass.
func (sv *Services) Sync(ctx context.Context) {
	// The changed Services are taken before the view is loaded:
	// they are those of views already stored (serviceChanges), so
	// the view loaded is theirs or a newer one, whose ports for
	// them are as right; keys stored after the take come with the
	// next pass, which the closed channel brings.
	keys, all := sv.cfg.Views.TakeServiceChanges()
	v := sv.cfg.Views.View()
	cfg := service.Config{ClusterCIDR: sv.cfg.ClusterCIDR, MasqueradeAll: sv.needMasqueradeAll()}
	if sv.cfg.Subnet != nil {
		cfg.NodeSubnet = sv.cfg.Subnet.Own()
	}
	start := time.Now()
	var wrote bool
	var err error
	if all {
		wrote, err = sv.cfg.Rules.Sync(ctx, v.AllPorts(), cfg)
	} else {
		svcs := make(map[string][]service.Port, len(keys))
		for _, k := range keys {
			svcs[k] = v.SvcPorts.Get(k)
		}
		wrote, err = sv.cfg.Rules.SyncServices(ctx, svcs, v.AllPorts, cfg)
	}
	if wrote {
		sv.cfg.Log.Info("service rules synced", "services", v.SvcPorts.Len(), "changed", len(keys), "took", time.Since(start).Round(time.Millisecond))
	}
	if err != nil {
		sv.cfg.Log.Warn("sync service rules", "err", err)
	}
}

// needMasqueradeAll reports whether bridged traffic bypasses netfilter in
// this namespace (bridge-nf-call-iptables is off and could not be turned
// on): then a same-node backend's reply would skip conntrack's reverse
// NAT, so all Service traffic is masqueraded, as kube-proxy's
// --masquerade-all does. It logs the switch both ways.
func (sv *Services) needMasqueradeAll() bool {
	all := !sv.cfg.BridgeNF()
	if all != sv.masqueradeAll {
		if all {
			sv.cfg.Log.Warn("bridged traffic does not pass netfilter (net.bridge.bridge-nf-call-iptables is off): masquerading all Service traffic; backends see a node address")
		} else {
			sv.cfg.Log.Info("bridge netfilter is on: Service traffic keeps the client's pod address")
		}
		sv.masqueradeAll = all
	}
	return all
}

// BridgeNFOn reports whether net.bridge.bridge-nf-call-iptables is on in
// this network namespace.
func BridgeNFOn() bool {
	b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}
