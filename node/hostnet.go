package node

import (
	"context"
	"io"
	"net"
	"net/netip"
	"path/filepath"

	"github.com/starling-orchestrator/starling/node/announce"
	"github.com/starling-orchestrator/starling/node/dataplane"
	"github.com/starling-orchestrator/starling/node/fencewatch"
	"github.com/starling-orchestrator/starling/node/ingress"
	"github.com/starling-orchestrator/starling/node/names"
)

// hostNetwork is what changes the node's network namespace: routes to
// peers, Service rules and the pod network. In-process tests run without
// one (nothing on the host changes); a dry run prints instead.
type hostNetwork struct {
	routes    dataplane.RouteApplier
	rules     dataplane.RuleSyncer
	useSubnet func(*net.IPNet) error
	// keepHost checks the pod masquerade rule and puts it back when it
	// is gone (podnet.Network.KeepHost).
	keepHost func() (bool, error)
}

// podNetwork is what configures the pod network for a claimed subnet:
// none in in-process tests (hn nil) and dry runs.
func (hn *hostNetwork) podNetwork(dryRun bool) func(*net.IPNet) error {
	if hn == nil || dryRun {
		return nil
	}
	return hn.useSubnet
}

// wireDataplane builds the controllers of the host's network (package
// dataplane) on hn's appliers, on the dry run's printers with
// --dry-run, or on none (in-process tests: nothing on the host changes).
func (a *Agent) wireDataplane(cfg Config, clusterNet *net.IPNet, clusterCIDR netip.Prefix, hn *hostNetwork, dryRunOut io.Writer) {
	log := a.log
	routeApply, rules, bridgeNF := dataplane.RouteApplier(nil), dataplane.RuleSyncer(nil), dataplane.BridgeNFOn
	routesReady, rulesReady := (<-chan struct{})(closed()), (<-chan struct{})(a.own.subnets.ready)
	var keepHost func() (bool, error)
	switch {
	case cfg.DryRun:
		// Nothing on the host changes: the route and rule controllers
		// print what they would apply, once the dry run's first look is
		// done.
		p := newPrinter(dryRunOut)
		p.nft = dryRunNFT(context.Background(), cfg.ProxyMode)
		a.network.dry = &dryRun{self: cfg.Name, fixed: cfg.PodSubnet, cluster: clusterNet, store: a.store, clock: a.clock, members: a.mem.members,
			subnets: a.own.subnets, status: a.own.status, views: a.views, print: p, log: log, ready: make(chan struct{})}
		routeApply, rules, bridgeNF, routesReady, rulesReady = p.routes, p, bridgeNFLoaded, a.network.dry.ready, a.network.dry.ready
	case hn != nil:
		routeApply, rules, keepHost = hn.routes, hn.rules, hn.keepHost
	}
	var addrs dataplane.Addresses
	if a.guard.auth != nil {
		addrs = a.guard.auth
	}
	a.network.routes = dataplane.NewRoutes(dataplane.RoutesConfig{Self: cfg.Name, Views: a.views, Subnet: a.own.subnets, Addresses: addrs, ClusterCIDR: clusterCIDR,
		Apply: routeApply, Ready: routesReady, Synced: a.mem.members.synced, Log: log})
	a.network.services = dataplane.NewServices(dataplane.ServicesConfig{Views: a.views, ClusterCIDR: clusterCIDR, Subnet: a.own.subnets, Rules: rules, Ready: rulesReady,
		Synced: a.mem.members.synced, BridgeNF: bridgeNF, Log: log})
	a.network.host = dataplane.NewHostRules(keepHost, log)
	if hn != nil && cfg.ClusterDNS {
		a.network.dns = &names.Supervisor{Self: cfg.Name, Domain: cfg.ClusterDomain, CIDRs: []string{cfg.ServiceCIDR, cfg.ClusterCIDR}, Dir: cfg.DataDir + "/dns",
			ResolvConf: cfg.ResolvConf, Views: a.views, Peer: a.api.peers.dnsLookup, Log: log}
	}
	if hn != nil && !cfg.DryRun && (cfg.IngressHTTP != "" || cfg.IngressHTTPS != "") {
		var acme *ingress.ACMEConfig
		if cfg.ACMEDirectory != "" {
			acme = &ingress.ACMEConfig{Self: cfg.Name, Directory: cfg.ACMEDirectory, Email: cfg.ACMEEmail, RootsFile: cfg.ACMECA}
		}
		a.network.ingress = ingress.New(ingress.Config{Views: a.views, HTTPAddr: cfg.IngressHTTP, HTTPSAddr: cfg.IngressHTTPS, ACME: acme, Log: log})
		a.own.status.labels = ingress.NodeLabels(cfg.Labels, cfg.IngressHTTP, cfg.ACMEDirectory) // peers find who serves and issues
	}
	if ips := advertisedIPs(cfg); hn != nil && !cfg.DryRun && len(ips) > 0 && ips[0].Is4() {
		lan, err := announce.NewLAN(ips[0], filepath.Join(cfg.DataDir, fencewatch.LBAddressesFile))
		if err != nil {
			log.Warn("loadbalancer: addresses an earlier run announced may remain", "err", err)
		}
		lease := filepath.Join(cfg.DataDir, fencewatch.LeaseFile) // the announcer holds no address past its LB deadline
		if !cfg.FenceWatchdog {
			lease = ""
		}
		a.network.lb = announce.New(announce.Config{Self: cfg.Name, Views: a.views, Quorum: a.work.fence, Link: lan, Synced: a.mem.members.synced, MaxSettle: cfg.RejoinSettle, LeaseFile: lease, Log: log})
	}
}
