// Package fencewatch is the fence watchdog's side of the fence lease
// (node/watchdog.go has the agent's): a process of its own, `starling
// fence-watchdog`, that outlives a hung or crashed agent and kills the
// processes of the node's StatefulSet replicas (and of the Deployment
// replicas that mount a claim), and takes its LoadBalancer addresses off
// the LAN, when the agent stops renewing its lease.
package fencewatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
)

// Files of the fence lease and its watchdog, in the data dir.
const (
	LeaseFile       = "fence.lease"
	watchdogPidName = "fence-watchdog.pid"
	watchdogLogName = "fence-watchdog.log"
)

// Lease is the lease file: until Deadline the agent answers for the
// StatefulSet replicas in Cgroups (cgroup paths, as in the OCI spec);
// until LBDeadline (zero: none) for the LoadBalancer addresses it put on
// the LAN, listed in LBAddressesFile beside the lease. Past LBDeadline
// the watchdog takes those off: an agent that crashed or hangs while its
// host stays up would otherwise leave its host answering ARP for them
// after its peers, which declared it dead, announce them.
type Lease struct {
	Deadline   time.Time `json:"deadline"`
	Cgroups    []string  `json:"cgroups"`
	LBDeadline time.Time `json:"lbDeadline,omitempty"`
}

// LBAddressesFile lists, one a line, the LoadBalancer addresses the agent
// put on the LAN (node/announce's LAN link keeps it).
const LBAddressesFile = "lb-addresses"

// Ensure starts 'starling fence-watchdog' for dataDir unless the
// one its pid file names still runs. The watchdog gets a session of its
// own, so a signal to the agent's process group does not reach it.
func Ensure(dataDir string) error {
	pidPath := filepath.Join(dataDir, watchdogPidName)
	lease := filepath.Join(dataDir, LeaseFile)
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
	return os.WriteFile(pidPath, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)
}

// watchdogPoll is how often the watchdog reads the lease.
const watchdogPoll = 250 * time.Millisecond

// Run is 'starling fence-watchdog': it reads the lease at
// leasePath every 250 ms and, once its deadline has passed, kills every
// process in the cgroups it names; it returns when the deadline has
// passed and none is left (or ctx ends). A lease that cannot be read
// for a minute ends it too (the agent starts a new one when it renews).
func Run(ctx context.Context, leasePath string, log *slog.Logger) error {
	log.Info("fence watchdog started", "lease", leasePath, "pid", os.Getpid())
	var unreadable time.Time
	reported, dropErr := false, ""
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
		if !l.LBDeadline.IsZero() && time.Now().After(l.LBDeadline) {
			// At every poll while the lease has lapsed, not once: a
			// half-hung agent may put an address back.
			n, err := dropAddresses(filepath.Join(filepath.Dir(leasePath), LBAddressesFile))
			if n > 0 || err != nil && err.Error() != dropErr {
				log.Warn("the agent did not renew its lease: took its LoadBalancer addresses off the LAN, which its peers announce", "addresses", n, "err", err)
			}
			dropErr = fmt.Sprint(err)
		}
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

// Write replaces the lease file atomically (a temporary file
// renamed over it), without fsync: the watchdog reads it from the page
// cache, a lease is worthless after a reboot, and two fsyncs a second
// would wear the SD cards edge nodes run on.
func Write(path string, b []byte) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// dropAddresses takes each address listed in the file at path off the
// interface that holds it as a /32, and returns how many it took off.
func dropAddresses(path string) (int, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	held, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, f := range strings.Fields(string(b)) {
		a, err := netip.ParseAddr(f)
		if err != nil || !a.Is4() {
			continue
		}
		for _, h := range held {
			ones, _ := h.Mask.Size()
			if ip, ok := netip.AddrFromSlice(h.IP.To4()); !ok || ip != a || ones != 32 {
				continue
			}
			link, err := netlink.LinkByIndex(h.LinkIndex)
			if err == nil {
				err = netlink.AddrDel(link, &h)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", a, err))
				continue
			}
			n++
		}
	}
	return n, errors.Join(errs...)
}

func readLease(path string) (Lease, error) {
	var l Lease
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
