// Package preflight decides whether a host has what the Starling agent
// needs before the agent changes anything on it: root, a reachable
// containerd, runc, the CNI plugins, iptables, and the kernel features of
// the pod network and of Service rules.
//
// Check is pure: it asks a Host (an interface) what is there and returns
// every problem at once, each with its fix (the Debian package to install,
// the module to load, or the flag that points elsewhere). System is the
// real Host; tests use a fake.
package preflight

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
)

// Host answers the questions Check asks about the machine (its current
// network namespace for sysctls). Implementations must not change it.
type Host interface {
	// IsRoot reports whether the process runs with effective UID 0.
	IsRoot() bool
	// DialUnix connects to a unix socket and hangs up; nil means it
	// accepts connections.
	DialUnix(path string) error
	// LookPath reports whether an executable is found on PATH.
	LookPath(name string) bool
	// Executable reports whether path is an executable regular file.
	Executable(path string) bool
	// Sysctl reports whether a /proc/sys file exists and can be written
	// (it is not written).
	Sysctl(path string) (exists, writable bool)
	// Kernel reports the state of a kernel feature.
	Kernel(f Feature) KernelState
	// FreeBytes reports the free space (bytes, statfs f_bavail) of the
	// filesystem that holds path.
	FreeBytes(path string) (uint64, error)
	// HasRoute reports whether the kernel would route a packet to ip
	// (a route lookup, as 'ip route get' does).
	HasRoute(ip netip.Addr) bool
}

// KernelState is what a Host can tell of a kernel feature.
type KernelState int

const (
	// KernelUnknown: the host could not tell (no kernel config and no
	// module list readable, as in some containers).
	KernelUnknown KernelState = iota
	// KernelActive: loaded, or built into the kernel.
	KernelActive
	// KernelLoadable: a module on disk, not loaded yet.
	KernelLoadable
	// KernelMissing: neither built in nor available as a module for the
	// running kernel.
	KernelMissing
)

// Feature is a kernel feature the agent relies on.
type Feature struct {
	// Module is the kernel module name (as for modprobe).
	Module string
	// Config is the kernel build option (as in /boot/config-*).
	Config string
	// Evidence are paths whose existence proves the feature is active
	// (besides /sys/module/<Module>).
	Evidence []string
	// Why says what the agent uses it for.
	Why string
	// MustBeLoaded: the agent needs it loaded before it starts (it writes
	// the feature's sysctls), rather than loaded on first use by the
	// kernel itself (bridge, veth and conntrack are autoloaded when a
	// bridge, a veth pair or a conntrack rule is created).
	MustBeLoaded bool
}

// BridgeNFCallIPTables is the sysctl that makes bridged pod-to-pod traffic
// pass iptables, so a Service reply from a same-node backend is
// un-NATed (kernel Documentation/networking/ip-sysctl.rst, br_netfilter).
const BridgeNFCallIPTables = "/proc/sys/net/bridge/bridge-nf-call-iptables"

// IPForward is the IPv4 forwarding sysctl; pods' traffic is routed.
const IPForward = "/proc/sys/net/ipv4/ip_forward"

// Features are the kernel features the agent needs.
var Features = []Feature{
	{Module: "bridge", Config: "CONFIG_BRIDGE", Why: "the node bridge starling0"},
	{Module: "veth", Config: "CONFIG_VETH", Why: "pod network interfaces"},
	{Module: "br_netfilter", Config: "CONFIG_BRIDGE_NETFILTER", Evidence: []string{BridgeNFCallIPTables},
		Why: "Service traffic between pods on one node (net.bridge.bridge-nf-call-iptables)", MustBeLoaded: true},
	{Module: "nf_conntrack", Config: "CONFIG_NF_CONNTRACK", Evidence: []string{"/proc/sys/net/netfilter/nf_conntrack_max"},
		Why: "Service NAT and the conntrack match"},
	{Module: "nf_nat", Config: "CONFIG_NF_NAT", Why: "Service DNAT and pod masquerade"},
}

// CNIPlugins are the CNI plugins the pod network runs.
var CNIPlugins = []string{"bridge", "host-local", "loopback"}

// Config says what to check.
type Config struct {
	// ContainerdAddress is containerd's socket; "" skips the check.
	ContainerdAddress string
	// CNIPluginDirs are searched for CNIPlugins; nil skips the check.
	CNIPluginDirs []string
	// DataDir is the agent's --data-dir (its store, pod logs and pod
	// files); "" skips the free-space warning.
	DataDir string
	// ServiceCIDR is the agent's --service-cidr; the zero prefix skips
	// the route warning.
	ServiceCIDR netip.Prefix
}

// LowFreeSpace is the free space of the data directory's filesystem
// (bytes) below which Warnings warns: the store stops writing at 64 MiB
// free (node/store.MinFree), and pod logs and files share the
// filesystem.
const LowFreeSpace = 1 << 30

// Problem is one missing prerequisite.
type Problem struct {
	// What is missing, with the detail found ("runc is not on PATH").
	What string
	// Fix says what to do: the package to install, the module to load,
	// or the flag to point elsewhere.
	Fix string
}

func (p Problem) String() string { return p.What + ": " + p.Fix }

// Error lists every missing prerequisite; one line each.
type Error struct {
	Problems []Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "this host lacks %d prerequisite(s) of the Starling agent; nothing was changed:", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  - ")
		b.WriteString(p.String())
	}
	return b.String()
}

// Check returns every missing prerequisite, in a fixed order, or nil.
func Check(h Host, cfg Config) []Problem {
	var out []Problem
	add := func(what, fix string, args ...any) {
		out = append(out, Problem{What: what, Fix: fmt.Sprintf(fix, args...)})
	}
	if !h.IsRoot() {
		add("not running as root", "the agent creates network namespaces, cgroups, routes and iptables rules; run it as root (e.g. the systemd unit in examples/systemd)")
	}
	if cfg.ContainerdAddress != "" {
		if err := h.DialUnix(cfg.ContainerdAddress); err != nil {
			add(fmt.Sprintf("containerd is not reachable at %s (%v)", cfg.ContainerdAddress, err),
				"install the Debian package containerd and start it (systemctl enable --now containerd), or point --containerd-address at its socket")
		}
	}
	if !h.LookPath("runc") {
		add("runc is not on PATH", "install the Debian package runc")
	}
	if cfg.CNIPluginDirs != nil {
		var missing []string
		for _, p := range CNIPlugins {
			found := false
			for _, dir := range cfg.CNIPluginDirs {
				if h.Executable(filepath.Join(dir, p)) {
					found = true
					break
				}
			}
			if !found {
				missing = append(missing, p)
			}
		}
		if len(missing) > 0 {
			add(fmt.Sprintf("CNI plugins %s not found in %s", strings.Join(missing, ", "), strings.Join(cfg.CNIPluginDirs, ", ")),
				"install the Debian package containernetworking-plugins, or point --cni-bin-dir at the directory that holds them")
		}
	}
	var ipt []string
	for _, bin := range []string{"iptables", "iptables-restore"} {
		if !h.LookPath(bin) {
			ipt = append(ipt, bin)
		}
	}
	if len(ipt) > 0 {
		add(strings.Join(ipt, " and ")+" not on PATH", "install the Debian package iptables")
	}
	for _, f := range Features {
		switch st := h.Kernel(f); {
		case st == KernelMissing:
			add(fmt.Sprintf("kernel module %s (%s, for %s) is neither built in nor installed for the running kernel", f.Module, f.Config, f.Why),
				"if the kernel was upgraded, reboot into it; otherwise use a kernel with %s (Debian's linux-image-amd64 has it)", f.Config)
		case f.MustBeLoaded && st != KernelActive:
			add(fmt.Sprintf("kernel module %s is not loaded (needed for %s)", f.Module, f.Why),
				"modprobe %s, and to load it at boot: echo %s > /etc/modules-load.d/starling.conf", f.Module, f.Module)
		}
	}
	// The agent turns these on itself; it only needs to be able to.
	for _, path := range []string{IPForward, BridgeNFCallIPTables} {
		exists, writable := h.Sysctl(path)
		if exists && !writable {
			add("sysctl "+sysctlName(path)+" cannot be written", "run the agent as root in the host's network namespace (not in an unprivileged container, where /proc/sys is read-only)")
		} else if !exists && path == IPForward {
			add("sysctl "+sysctlName(path)+" does not exist", "the kernel lacks IPv4 networking in this namespace; run the agent on the host")
		}
		// A missing bridge sysctl is br_netfilter not loaded, reported above.
	}
	return out
}

// Warnings returns what the agent can start without but should be
// fixed: less than LowFreeSpace free in the data directory's filesystem,
// and no route to the service range.
func Warnings(h Host, cfg Config) []Problem {
	var out []Problem
	if cfg.DataDir != "" {
		if free, err := h.FreeBytes(cfg.DataDir); err == nil && free < LowFreeSpace {
			out = append(out, Problem{
				What: fmt.Sprintf("the filesystem of data directory %s has %.0f MiB free (less than %d MiB)", cfg.DataDir, float64(free)/(1<<20), LowFreeSpace>>20),
				Fix:  "below 64 MiB free the agent refuses API writes (ENOSPC) until 160 MiB are free again (a first start needs 160 MiB); free space there, or point --data-dir at a larger filesystem",
			})
		}
	}
	// A ClusterIP is virtual: a process of the host's own namespace
	// connects to it only if the kernel has a route to pick a source
	// address and device before the Service rules (output NAT) see the
	// packet; with no route, connect fails with ENETUNREACH. Pods are
	// not affected (their default route is the bridge).
	if cfg.ServiceCIDR.IsValid() && !h.HasRoute(cfg.ServiceCIDR.Addr()) {
		out = append(out, Problem{
			What: fmt.Sprintf("this host has no route to the service range %s (no default route)", cfg.ServiceCIDR),
			Fix:  fmt.Sprintf("processes on the host itself cannot reach ClusterIPs (connect fails before any Service rule; pods can); add a default route, or a route to the range through the LAN interface: ip route add %s dev IFACE", cfg.ServiceCIDR),
		})
	}
	return out
}

// Run checks and returns an *Error listing every problem, or nil.
func Run(h Host, cfg Config) error {
	if ps := Check(h, cfg); len(ps) > 0 {
		return &Error{Problems: ps}
	}
	return nil
}

// sysctlName turns /proc/sys/net/ipv4/ip_forward into net.ipv4.ip_forward.
func sysctlName(path string) string {
	return strings.ReplaceAll(strings.TrimPrefix(path, "/proc/sys/"), "/", ".")
}
