package node

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/announce"
	"github.com/starling-orchestrator/starling/node/fencewatch"
	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

// The one-copy promise without the agent. A node that is cut off fences
// itself (fence.go): it kills its StatefulSet replicas --fence-timeout
// after it last heard a majority, well before the others start them
// (--failover-timeout after they declared it dead). An agent that hangs
// (SIGSTOP, a stuck disk) or crashes cannot; its containers keep running
// under containerd's shims. So a small process that outlives the agent,
// the fence watchdog ('starling fence-watchdog', started by the agent),
// does it instead: the agent renews a lease in its data dir every
// 500 ms while it knows it holds a majority, naming the cgroups of its
// StatefulSet replicas; when the lease's deadline passes, the watchdog
// kills every process in those cgroups (SIGKILL, straight through the
// cgroup filesystem: no agent or containerd needed) and, once none is
// left, exits. The agent starts a new one when it renews again.
//
// The deadline is --failover-timeout - 5 s after the renewal (10 s with
// the defaults): the others start a dead node's StatefulSet replica at
// least --failover-timeout after they declared it dead, which is after
// its last renewal, so the copy is dead 5 s before; and an agent
// restarted within the deadline (an upgrade, a crash) takes its replicas
// back untouched. Compare Nomad's disconnect.stop_on_client_after (the
// client stops its allocations after a timeout) and Kubernetes, which
// never replaces a StatefulSet pod until its kubelet confirms it is gone
// (no second copy, but no failover either without an operator).

const (
	leaseRenewPeriod = 500 * time.Millisecond
	// deadlineMargin is how long before the others may start a replica
	// the watchdog has killed it.
	deadlineMargin = 5 * time.Second
)

// leaseDeadline is the lease deadline of a renewal at now (see above).
func (c Config) leaseDeadline(now time.Time) time.Time {
	return now.Add(max(c.FailoverTimeout-deadlineMargin, c.FenceTimeout))
}

// lease is the fence lease this node renews for its watchdog. It owns
// its lock, which also serialises renewals.
type lease struct {
	enabled bool // --fence-watchdog
	dataDir string
	cfg     Config // for leaseDeadline
	rt      Runtime
	fence   *fence
	log     *slog.Logger

	mu sync.Mutex
	// atMostOne are the container IDs of this node's StatefulSet
	// replicas; leased the IDs the last lease named.
	atMostOne []string
	leased    []string
}

// loop renews the lease every leaseRenewPeriod while this node knows it
// has a majority, and keeps a watchdog running while it does.
func (l *lease) loop(ctx context.Context) {
	if !l.enabled {
		return
	}
	trust.Every(ctx, leaseRenewPeriod, l.renew)
}

// renew writes the lease, naming the cgroups of atMostOne, if this node
// knows it holds a majority, and makes sure a watchdog runs. Serialised by
// mu; reconcile calls it too, before it starts a StatefulSet replica the
// last lease does not name (set), so no copy ever runs outside the lease.
func (l *lease) renew() {
	if !l.enabled {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if !l.fence.forLease(now) {
		return // fenced or not known yet: the watchdog may act
	}
	path := filepath.Join(l.dataDir, fencewatch.LeaseFile)
	fl := fencewatch.Lease{Deadline: l.cfg.leaseDeadline(now), LBDeadline: now.Add(announce.LeaseFor(l.cfg.ProbeInterval, l.cfg.ProbeTimeout, l.cfg.SuspicionMult, leaseRenewPeriod))}
	for _, id := range l.atMostOne {
		fl.Cgroups = append(fl.Cgroups, l.rt.CgroupPath(id))
	}
	b, err := json.Marshal(fl)
	if err == nil {
		err = fencewatch.Write(path, b)
	}
	if err != nil {
		l.log.Error("renew the fence lease (its watchdog will kill this node's StatefulSet replicas when it runs out)", "err", err, "file", path)
		return
	}
	l.leased = slices.Clone(l.atMostOne)
	l.fence.leased(fl.Deadline)
	if err := fencewatch.Ensure(l.dataDir); err != nil {
		l.log.Error("start the fence watchdog", "err", err)
	}
}

// set records this node's StatefulSet containers (and those it is about
// to create) and, when one is not in the last lease, renews the lease
// before reconcile acts.
func (l *lease) set(ids []string) {
	l.mu.Lock()
	l.atMostOne = ids
	covered := true
	for _, id := range ids {
		if !slices.Contains(l.leased, id) {
			covered = false
		}
	}
	l.mu.Unlock()
	if !covered {
		l.renew()
	}
}

// atMostOneIDs returns the container IDs of this node's StatefulSet
// replicas, their members too: those observed and those it is about to
// create.
func atMostOneIDs(v *view.View, observed []reconcile.Container, mine []reconcile.Replica) []string {
	stateful := v.StatefulWorkloads()
	var ids []string
	for _, c := range reconcile.Flatten(observed) {
		if stateful[reconcile.WorkloadKey(c.Namespace, c.Workload)] {
			ids = append(ids, c.ID)
		}
	}
	for _, r := range mine {
		for _, id := range r.ContainerIDs() {
			if r.AtMostOne && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}
