package names

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/dns"
	"github.com/starling-orchestrator/starling/node/pidns"
	"github.com/starling-orchestrator/starling/node/view"
)

// Views are the node's views: the latest, and a channel that says a
// newer one is there.
type Views interface {
	View() *view.View
	Changed() <-chan struct{}
}

// Supervisor keeps the node's DNS answering: on each new view it writes
// the zone's input to Dir/zone.json (when it changed), and it keeps one
// `starling dns-server` process listening on the node's DNS address
// (dns.Nameserver of its pod subnet, port 53) with the node's upstream
// resolvers. The process outlives the agent (its own session), so a
// restarted agent leaves DNS answering; a process of another binary (an
// upgrade), address or upstream list is replaced, the new one listening
// (SO_REUSEPORT) before the old one is stopped, so no query goes
// unanswered.
type Supervisor struct {
	Self string
	// Domain is the cluster domain ("cluster.local").
	Domain string
	// CIDRs are the cluster's address ranges (service and pod CIDRs):
	// reverse lookups of their addresses are answered by the zone
	// (dns.Input's Reverse).
	CIDRs []string
	// Dir holds the zone, the server's PID and its log.
	Dir string
	// ResolvConf and UpstreamResolvConf are where the upstream resolvers
	// are read (dns.HostResolver).
	ResolvConf, UpstreamResolvConf string
	Views                          Views
	// Peer asks node (its record s) a DNS lookup with q.Node set
	// (Lookup's of a replica of another node); nil: none is asked.
	Peer func(ctx context.Context, node string, s view.NodeStatus, q api.DNSQuery) (api.DNSAnswer, error)
	Log  *slog.Logger
}

// Files in Dir.
const (
	zoneFile = "zone.json"
	pidFile  = "dns-server.pid"
	logFile  = "dns-server.log"
)

// ServerCommand is the argument that runs the DNS server process.
const ServerCommand = "dns-server"

// Run writes the zone and keeps the server running until ctx ends; the
// server keeps running after.
func (s *Supervisor) Run(ctx context.Context) {
	check := time.NewTicker(5 * time.Second)
	defer check.Stop()
	for {
		v := s.Views.View()
		// A node that does not hold the cluster's state yet would
		// answer NXDOMAIN for Services it has not heard of: the zone it
		// wrote before (an agent restart) stands until it does.
		if v.Synced {
			in := InputOf(v, s.Domain)
			for _, c := range s.CIDRs {
				if p, err := netip.ParsePrefix(c); err == nil {
					in.Reverse = append(in.Reverse, p.Masked())
				}
			}
			if _, err := dns.Write(filepath.Join(s.Dir, zoneFile), in); err != nil {
				s.Log.Warn("write the DNS zone", "err", err)
			}
		}
		if err := s.ensure(v); err != nil {
			s.Log.Warn("run the node's DNS server", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.Views.Changed():
		case <-check.C:
		}
	}
}

// ensure starts the server unless one of the right arguments and binary
// runs; a server replaced is stopped once the new one has started.
func (s *Supervisor) ensure(v *view.View) error {
	st, ok := v.Statuses[s.Self]
	if !ok || !st.SubnetReady {
		return nil // the bridge has no address yet
	}
	subnet, err := netip.ParsePrefix(st.PodSubnet)
	if err != nil {
		return err
	}
	addr, err := dns.Nameserver(subnet)
	if err != nil {
		return err
	}
	r, err := dns.HostResolver(s.ResolvConf, s.UpstreamResolvConf)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{ServerCommand, "--listen", net.JoinHostPort(addr.String(), "53"), "--zone", filepath.Join(s.Dir, zoneFile)}
	for _, up := range r.Upstreams() {
		args = append(args, "--upstream", up)
	}
	old, running := s.running()
	if running && sameProcess(old, exe, args) {
		return nil
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(s.Dir, logFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // reaped by this agent run if it ends before the agent
	pids := filepath.Join(s.Dir, pidFile)
	if err := os.WriteFile(pids, []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		return err
	}
	if running {
		// The new server listens beside the old one (SO_REUSEPORT)
		// before the old one goes; a new one that exits at once (a new
		// binary that fails, a flag it refuses) leaves the old one
		// serving.
		select {
		case <-exited:
			if err := os.WriteFile(pids, []byte(strconv.Itoa(old)), 0o600); err != nil {
				return err
			}
			return fmt.Errorf("the new DNS server (%s) exited at once; the one running stays: see %s", exe, filepath.Join(s.Dir, logFile))
		case <-time.After(time.Second):
		}
	}
	s.Log.Info("started the node's DNS server", "pid", cmd.Process.Pid, "args", strings.Join(args[1:], " "))
	if running {
		if err := syscall.Kill(old, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("stop the DNS server replaced: %w", err)
		}
	}
	return nil
}

// running is the PID of the server the PID file names, if it runs (a
// PID reused by another process does not count).
func (s *Supervisor) running() (int, bool) {
	return pidns.Running(filepath.Join(s.Dir, pidFile), func(args []string) bool {
		return len(args) > 2 && args[1] == ServerCommand && slices.Contains(args, filepath.Join(s.Dir, zoneFile))
	})
}

// sameProcess reports whether process pid runs binary exe with args (a
// binary replaced since it started, an upgrade, reads "EXE (deleted)").
func sameProcess(pid int, exe string, args []string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	got := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	if len(got) < 1 || !slices.Equal(got[1:], args) {
		return false
	}
	link, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return err == nil && link == exe
}
