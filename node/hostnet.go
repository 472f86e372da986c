package node

import (
	"context"
	"net"
	"time"
)

// hostLoop puts the pod masquerade rule back within a second when someone
// removed it (iptables -t nat -F, nft flush ruleset): the Service rules
// and routes are repaired by their own loops, and this rule is what pods
// need to reach anything outside the cluster.
func (a *Agent) hostLoop(ctx context.Context) {
	if a.keepHost == nil {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		repaired, err := a.keepHost()
		switch {
		case err != nil && !warned:
			a.log.Warn("check the pod masquerade rule", "err", err)
			warned = true
		case err == nil && repaired:
			a.log.Warn("the pod masquerade rule was gone (a flush of the nat table?); put back")
			warned = false
		case err == nil:
			warned = false
		}
	}
}

// hostNetwork is what changes the node's network namespace: routes to
// peers, Service rules and the pod network. In-process tests run without
// one (nothing on the host changes); a dry run prints instead.
type hostNetwork struct {
	routes    routeApplier
	rules     ruleSyncer
	useSubnet func(*net.IPNet) error
	// keepHost checks the pod masquerade rule and puts it back when it
	// is gone (podnet.Network.KeepHost).
	keepHost func() (bool, error)
}
