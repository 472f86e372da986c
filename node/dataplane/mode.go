package dataplane

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/starling-orchestrator/starling/net/podnet"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/net/xtables"
	"golang.org/x/sys/unix"
)

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

// ServiceSyncer chooses how Service rules are written: mode, or with
// ProxyAuto nftables where the kernel takes it and is at least
// nftMinKernel, unless the host's firewall is on iptables-legacy (its
// rules and ours would run in two stacks); it logs the choice and
// removes what a run in the other mode left. ipt is the host's iptables
// backend (IptablesBackend): with nftables, the forward accept rules
// stay there.
func ServiceSyncer(ctx context.Context, mode string, ipt xtables.Backend, log *slog.Logger) (*service.Syncer, error) {
	why := "--proxy-mode " + mode
	if mode == ProxyAuto {
		mode, why = AutoProxyMode(ctx, ipt, service.NFTSupported())
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

// AutoProxyMode is the mode ProxyAuto stands for on this host, and why:
// nftables unless the host's firewall is on iptables-legacy, the kernel
// is older than nftMinKernel, or nftErr says it does not take nftables
// rules.
func AutoProxyMode(ctx context.Context, ipt xtables.Backend, nftErr error) (mode, why string) {
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

// IptablesBackend chooses the iptables backend the host's firewall uses
// (xtables.Detect), logs the choice, and removes Starling's chains from
// the other backend, left there by a run that chose it (both would run).
func IptablesBackend(ctx context.Context, log *slog.Logger) xtables.Backend {
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
