package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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

// Files of the fence lease and its watchdog, in the data dir.
const (
	leaseFileName    = "fence.lease"
	watchdogPidName  = "fence-watchdog.pid"
	watchdogLogName  = "fence-watchdog.log"
	leaseRenewPeriod = 500 * time.Millisecond
	// deadlineMargin is how long before the others may start a replica
	// the watchdog has killed it.
	deadlineMargin = 5 * time.Second
)

// fenceLease is the lease file: until Deadline the agent answers for the
// StatefulSet replicas in Cgroups (cgroup paths, as in the OCI spec).
type fenceLease struct {
	Deadline time.Time `json:"deadline"`
	Cgroups  []string  `json:"cgroups"`
}

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
	path := filepath.Join(l.dataDir, leaseFileName)
	fl := fenceLease{Deadline: l.cfg.leaseDeadline(now)}
	for _, id := range l.atMostOne {
		fl.Cgroups = append(fl.Cgroups, l.rt.CgroupPath(id))
	}
	b, err := json.Marshal(fl)
	if err == nil {
		err = writeLease(path, b)
	}
	if err != nil {
		l.log.Error("renew the fence lease (its watchdog will kill this node's StatefulSet replicas when it runs out)", "err", err, "file", path)
		return
	}
	l.leased = slices.Clone(l.atMostOne)
	l.fence.leased(fl.Deadline)
	if err := ensureWatchdog(l.dataDir); err != nil {
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

// ensureWatchdog starts 'starling fence-watchdog' for dataDir unless the
// one its pid file names still runs. The watchdog gets a session of its
// own, so a signal to the agent's process group does not reach it.
func ensureWatchdog(dataDir string) error {
	pidPath := filepath.Join(dataDir, watchdogPidName)
	lease := filepath.Join(dataDir, leaseFileName)
	if b, err := os.ReadFile(pidPath); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if strings.Contains(string(cmdline), "fence-watchdog") && strings.Contains(string(cmdline), lease) {
				return nil
			}
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(dataDir, watchdogLogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self, "fence-watchdog", "--lease", lease)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	go cmd.Wait() // reap it if it exits while this agent runs
	return trust.WritePrivate(pidPath, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"))
}

// watchdogPoll is how often the watchdog reads the lease.
const watchdogPoll = 250 * time.Millisecond

// RunFenceWatchdog is 'starling fence-watchdog': it reads the lease at
// leasePath every 250 ms and, once its deadline has passed, kills every
// process in the cgroups it names; it returns when the deadline has
// passed and none is left (or ctx ends). A lease that cannot be read
// for a minute ends it too (the agent starts a new one when it renews).
func RunFenceWatchdog(ctx context.Context, leasePath string, log *slog.Logger) error {
	log.Info("fence watchdog started", "lease", leasePath, "pid", os.Getpid())
	var unreadable time.Time
	reported := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(watchdogPoll):
		}
		l, err := readLease(leasePath)
		if err != nil {
			if unreadable.IsZero() {
				unreadable = time.Now()
			}
			if time.Since(unreadable) > time.Minute {
				return fmt.Errorf("the lease %s cannot be read: %w", leasePath, err)
			}
			continue
		}
		unreadable = time.Time{}
		if time.Now().Before(l.Deadline) {
			reported = false
			continue
		}
		killed, left := killCgroups(l.Cgroups)
		if killed > 0 && !reported {
			log.Warn("the agent did not renew its fence lease: killed the processes of its StatefulSet replicas, so no second copy can run once the others start them",
				"deadline", l.Deadline, "processes", killed, "cgroups", l.Cgroups)
			reported = true
		}
		if left == 0 {
			log.Info("fence watchdog done: the lease ran out and no StatefulSet replica runs here", "cgroups", l.Cgroups)
			return nil
		}
	}
}

// writeLease replaces the lease file atomically (a temporary file
// renamed over it), without fsync: the watchdog reads it from the page
// cache, a lease is worthless after a reboot, and two fsyncs a second
// would wear the SD cards edge nodes run on.
func writeLease(path string, b []byte) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readLease(path string) (fenceLease, error) {
	var l fenceLease
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &l)
	}
	return l, err
}

// killCgroups sends SIGKILL to every process in the cgroups (paths as in
// the OCI spec, under any hierarchy that has them: cgroup v2, or v1's
// pids, memory or freezer) and returns how many it signalled and how
// many were still listed before the signal (0: none left).
func killCgroups(cgroups []string) (killed, left int) {
	for _, cg := range cgroups {
		if strings.Contains(cg, "..") {
			continue
		}
		for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/freezer"} {
			b, err := os.ReadFile(filepath.Join(root, cg, "cgroup.procs"))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err != nil || pid <= 1 {
					continue
				}
				left++
				if err := syscall.Kill(pid, syscall.SIGKILL); err == nil || !errors.Is(err, syscall.ESRCH) {
					killed++
				}
			}
			break
		}
	}
	return killed, left
}
