package node

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/net/podnet"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/net/xtables"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

// ruleSyncer applies Service rules: service.Syncer, or the dry run's
// printer. Sync is given every port, SyncServices the ports of the
// Services that changed (and every port, on demand, for a full sync);
// both report whether they wrote anything.
type ruleSyncer interface {
	Sync(ctx context.Context, ports []service.Port, cfg service.Config) (bool, error)
	SyncServices(ctx context.Context, changed map[string][]service.Port, all func() []service.Port, cfg service.Config) (bool, error)
}

// services keeps this node's Service rules following the view. It owns
// its state.
type services struct {
	views       *view.Builder
	clusterCIDR netip.Prefix
	rules       ruleSyncer
	// ready is closed when rules may be applied (the pod network is up);
	// synced when this node holds the cluster's state (members.synced).
	// Until both, the rules the previous agent run programmed stay as
	// they are: a first sync on a view from before the join's push/pull
	// (this node the only live member) programmed every Service with
	// only its local endpoints, or none, and refused connections.
	ready, synced <-chan struct{}
	// bridgeNF reports whether bridged traffic passes netfilter
	// (bridgeNFOn on a real node).
	bridgeNF func() bool
	log      *slog.Logger

	masqueradeAll bool // owned by loop
}

// loop keeps the Service rules: after a change (debounced 100 ms) and
// every second, when the canary shows the rules were flushed.
func (sv *services) loop(ctx context.Context) {
	if sv.rules == nil {
		return
	}
	for _, ch := range []<-chan struct{}{sv.ready, sv.synced} {
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
	sv.views.Rebuild(time.Now())
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		changed := sv.views.Changed()
		sv.sync(ctx)
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

// sync brings the rules to the current view: the Services noted as
// changed since the last pass, or every port (the first view, or when
// the syncer finds a full sync due). Call it after taking the channel of
// the next view (view.Builder.Changed), so a view stored meanwhile wakes the
// next pass.
func (sv *services) sync(ctx context.Context) {
	// The changed Services are taken before the view is loaded:
	// they are those of views already stored (serviceChanges), so
	// the view loaded is theirs or a newer one, whose ports for
	// them are as right; keys stored after the take come with the
	// next pass, which the closed channel brings.
	keys, all := sv.views.TakeServiceChanges()
	v := sv.views.View()
	cfg := service.Config{ClusterCIDR: sv.clusterCIDR, MasqueradeAll: sv.needMasqueradeAll()}
	start := time.Now()
	var wrote bool
	var err error
	if all {
		wrote, err = sv.rules.Sync(ctx, v.AllPorts(), cfg)
	} else {
		svcs := make(map[string][]service.Port, len(keys))
		for _, k := range keys {
			svcs[k] = v.SvcPorts.Get(k)
		}
		wrote, err = sv.rules.SyncServices(ctx, svcs, v.AllPorts, cfg)
	}
	if wrote {
		sv.log.Info("service rules synced", "services", v.SvcPorts.Len(), "changed", len(keys), "took", time.Since(start).Round(time.Millisecond))
	}
	if err != nil {
		sv.log.Warn("sync service rules", "err", err)
	}
}

// needMasqueradeAll reports whether bridged traffic bypasses netfilter in
// this namespace (bridge-nf-call-iptables is off and could not be turned
// on): then a same-node backend's reply would skip conntrack's reverse
// NAT, so all Service traffic is masqueraded, as kube-proxy's
// --masquerade-all does. It logs the switch both ways.
func (sv *services) needMasqueradeAll() bool {
	all := !sv.bridgeNF()
	if all != sv.masqueradeAll {
		if all {
			sv.log.Warn("bridged traffic does not pass netfilter (net.bridge.bridge-nf-call-iptables is off): masquerading all Service traffic; backends see a node address")
		} else {
			sv.log.Info("bridge netfilter is on: Service traffic keeps the client's pod address")
		}
		sv.masqueradeAll = all
	}
	return all
}

// bridgeNFOn reports whether net.bridge.bridge-nf-call-iptables is on in
// this network namespace.
func bridgeNFOn() bool {
	b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

// decorateServices fills in the allocated ClusterIP and NodePorts of the
// Services in items (JSON objects), as a Kubernetes API server shows them.
func decorateServices(alloc service.Allocation, items []api.Object) {
	for i, it := range items {
		o, err := manifest.Decode(it.Object)
		if err != nil || o.Service == nil {
			continue
		}
		key := o.Namespace + "/" + o.Name
		if ip, ok := alloc.ClusterIPs[key]; ok {
			o.Service.Spec.ClusterIP = ip.String()
			o.Service.Spec.ClusterIPs = []string{ip.String()}
		}
		for j, p := range o.Service.Spec.Ports {
			if np, ok := alloc.NodePorts[key+"/"+p.Name]; ok {
				o.Service.Spec.Ports[j].NodePort = np
			}
		}
		if b, err := manifest.Encode(o); err == nil {
			items[i].Object = b
		}
	}
}

// serviceLinks returns the environment variables enableServiceLinks gives
// a container in namespace ns, by the kubelet's rules
// (pkg/kubelet/envvars FromServices): for every Service of ns with a
// ClusterIP (headless ones have none), by Service name, with NAME its
// name upper-cased and "-" made "_":
//
//	NAME_SERVICE_HOST=<clusterIP>  NAME_SERVICE_PORT=<first port>
//	NAME_SERVICE_PORT_<PORT NAME>=<port>            (named ports)
//	NAME_PORT=<proto>://<clusterIP>:<first port>
//	NAME_PORT_<port>_<PROTO>=<proto>://<clusterIP>:<port>, and its
//	_PROTO, _PORT and _ADDR                         (every port)
//
// Kubernetes also adds the "kubernetes" API Service of the default
// namespace; Starling has no such Service.
func serviceLinks(svcs []manifest.Object, alloc service.Allocation, ns string) []reconcile.EnvVar {
	var out []reconcile.EnvVar
	add := func(name, value string) { out = append(out, reconcile.EnvVar{Name: name, Value: value}) }
	envName := func(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }
	sorted := slices.Clone(svcs)
	slices.SortFunc(sorted, func(a, b manifest.Object) int { return strings.Compare(a.Name, b.Name) })
	for _, o := range sorted {
		s := o.Service
		if o.Namespace != ns || s == nil || s.Spec.ClusterIP == corev1.ClusterIPNone || len(s.Spec.Ports) == 0 {
			continue
		}
		ip, ok := alloc.ClusterIPs[o.Namespace+"/"+o.Name]
		if !ok {
			continue
		}
		prefix := envName(o.Name)
		add(prefix+"_SERVICE_HOST", ip.String())
		add(prefix+"_SERVICE_PORT", strconv.Itoa(int(s.Spec.Ports[0].Port)))
		for _, p := range s.Spec.Ports {
			if p.Name != "" {
				add(prefix+"_SERVICE_PORT_"+envName(p.Name), strconv.Itoa(int(p.Port)))
			}
		}
		for i, p := range s.Spec.Ports {
			proto := string(p.Protocol)
			if proto == "" {
				proto = string(corev1.ProtocolTCP)
			}
			url := strings.ToLower(proto) + "://" + netip.AddrPortFrom(ip, uint16(p.Port)).String()
			if i == 0 {
				add(prefix+"_PORT", url)
			}
			pp := fmt.Sprintf("%s_PORT_%d_%s", prefix, p.Port, strings.ToUpper(proto))
			add(pp, url)
			add(pp+"_PROTO", strings.ToLower(proto))
			add(pp+"_PORT", strconv.Itoa(int(p.Port)))
			add(pp+"_ADDR", ip.String())
		}
	}
	return out
}

// withServiceLinks fills in the Service variables (serviceLinks) of the
// replicas acts create, from the snapshot's Services.
func withServiceLinks(v *view.View, acts []reconcile.Action) {
	for i := range acts {
		act := &acts[i]
		if act.Replica.ID == "" || act.Replica.Spec.NoServiceLinks || (act.Type != reconcile.Create && act.Type != reconcile.Replace) {
			continue
		}
		act.Replica.ServiceEnv = serviceLinks(v.Services, v.Alloc, act.Replica.Namespace)
	}
}

// Proxy modes (--proxy-mode): how Service rules are written.
const (
	ProxyAuto     = ""         // nftables where the kernel takes it, else iptables
	ProxyIptables = "iptables" // iptables-restore, in the host's iptables backend
	ProxyNftables = "nftables" // the ip starling table, over netlink
)

// nftMinKernel is the oldest kernel (major, minor) the nftables proxy
// mode is chosen on by default: kube-proxy's floor for its nftables mode
// (5.13), older kernels lacking what its layout relies on.
var nftMinKernel = [2]int{5, 13}

// serviceSyncer chooses how Service rules are written: mode, or with
// ProxyAuto nftables where the kernel takes it and is at least
// nftMinKernel, unless the host's firewall is on iptables-legacy (its
// rules and ours would run in two stacks); it logs the choice and
// removes what a run in the other mode left. ipt is the host's iptables
// backend (iptablesBackend): with nftables, the forward accept rules
// stay there.
func serviceSyncer(ctx context.Context, mode string, ipt xtables.Backend, log *slog.Logger) (*service.Syncer, error) {
	why := "--proxy-mode " + mode
	if mode == ProxyAuto {
		mode, why = autoProxyMode(ctx, ipt, service.NFTSupported())
	}
	log.Info("service proxy mode chosen", "mode", mode, "why", why)
	if mode == ProxyNftables {
		s, err := service.NewNFTSyncer(&ipt)
		if err != nil {
			return nil, err
		}
		// The iptables Service chains of a run in iptables mode; the pod
		// masquerade and the forward accept rules stay in iptables.
		if n, err := xtables.RemoveStarling(ctx, ipt, podnet.MasqueradeChain, service.ChainForward); err != nil {
			log.Warn("remove Starling's iptables Service rules", "backend", ipt.String(), "err", err)
		} else if n > 0 {
			log.Info("removed Starling's iptables Service chains (now in nftables)", "backend", ipt.String(), "chains", n)
		}
		return s, nil
	}
	if had, err := service.RemoveNFT(); err != nil {
		log.Warn("remove Starling's nftables table", "table", "ip "+service.NFTTable, "err", err)
	} else if had {
		log.Info("removed Starling's nftables table (now in iptables)", "table", "ip "+service.NFTTable)
	}
	return service.NewSyncer(ipt)
}

// autoProxyMode is the mode ProxyAuto stands for on this host, and why:
// nftables unless the host's firewall is on iptables-legacy, the kernel
// is older than nftMinKernel, or nftErr says it does not take nftables
// rules.
func autoProxyMode(ctx context.Context, ipt xtables.Backend, nftErr error) (mode, why string) {
	switch {
	case ipt.Mode == "legacy" || ipt.Mode == "" && !xtables.IsNFT(ctx, ipt):
		return ProxyIptables, "the host's firewall is on iptables-legacy"
	case kernelBefore(nftMinKernel):
		return ProxyIptables, fmt.Sprintf("the kernel is older than %d.%d", nftMinKernel[0], nftMinKernel[1])
	case nftErr != nil:
		return ProxyIptables, fmt.Sprintf("the kernel does not take nftables rules (%v)", nftErr)
	}
	return ProxyNftables, "the kernel takes nftables rules"
}

// kernelBefore reports whether the running kernel's version is below v
// (major, minor); an unreadable version counts as recent.
func kernelBefore(v [2]int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major < v[0] || major == v[0] && minor < v[1]
}

// iptablesBackend chooses the iptables backend the host's firewall uses
// (xtables.Detect), logs the choice, and removes Starling's chains from
// the other backend, left there by a run that chose it (both would run).
func iptablesBackend(ctx context.Context, log *slog.Logger) xtables.Backend {
	b, why := xtables.Detect(ctx)
	log.Info("iptables backend chosen", "backend", b.String(), "why", why)
	if other := b.Other(); other != b {
		if n, err := xtables.RemoveStarling(ctx, other); err != nil {
			log.Warn("remove Starling's rules from the other iptables backend", "backend", other.String(), "err", err)
		} else if n > 0 {
			log.Info("removed Starling's chains from the other iptables backend", "backend", other.String(), "chains", n)
		}
	}
	return b
}
