package dataplane

import (
	"context"
	"log/slog"
	"time"
)

// HostRules puts the pod masquerade rule back within a second when
// someone removed it (iptables -t nat -F, nft flush ruleset): the
// Service rules and routes are repaired by their own controllers, and
// this rule is what pods need to reach anything outside the cluster.
type HostRules struct {
	// keep checks the rule and puts it back when it is gone, reporting
	// whether it did (podnet.Network.KeepHost); nil: nothing to keep.
	keep func() (bool, error)
	log  *slog.Logger
}

// NewHostRules returns the controller that keeps the pod masquerade
// rule with keep (podnet.Network.KeepHost; nil on a node that changes
// nothing on the host).
func NewHostRules(keep func() (bool, error), log *slog.Logger) *HostRules {
	return &HostRules{keep: keep, log: log}
}

// Run checks the rule every second until ctx ends, warning once per
// failure streak.
func (h *HostRules) Run(ctx context.Context) {
	if h.keep == nil {
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
		repaired, err := h.keep()
		switch {
		case err != nil && !warned:
			h.log.Warn("check the pod masquerade rule", "err", err)
			warned = true
		case err == nil && repaired:
			h.log.Warn("the pod masquerade rule was gone (a flush of the nat table?); put back")
			warned = false
		case err == nil:
			warned = false
		}
	}
}
