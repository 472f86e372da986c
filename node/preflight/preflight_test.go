package preflight

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// fakeHost is a host with everything present unless a field says otherwise.
type fakeHost struct {
	notRoot    bool
	dialErr    error
	noPath     map[string]bool // executables missing from PATH
	noFile     map[string]bool // plugin paths missing
	kernel     map[string]KernelState
	sysctlGone map[string]bool
	sysctlRO   bool
	free       uint64 // bytes free in the data directory; 0: plenty
	noRoute    bool   // no route to anything
}

func (f fakeHost) HasRoute(netip.Addr) bool { return !f.noRoute }

func (f fakeHost) IsRoot() bool                { return !f.notRoot }
func (f fakeHost) DialUnix(string) error       { return f.dialErr }
func (f fakeHost) LookPath(name string) bool   { return !f.noPath[name] }
func (f fakeHost) Executable(path string) bool { return !f.noFile[path] }
func (f fakeHost) Sysctl(path string) (bool, bool) {
	if f.sysctlGone[path] {
		return false, false
	}
	return true, !f.sysctlRO
}
func (f fakeHost) FreeBytes(string) (uint64, error) {
	if f.free == 0 {
		return 100 << 30, nil
	}
	return f.free, nil
}
func (f fakeHost) Kernel(ft Feature) KernelState {
	if st, ok := f.kernel[ft.Module]; ok {
		return st
	}
	return KernelActive
}

var cfg = Config{ContainerdAddress: "/run/containerd/containerd.sock", CNIPluginDirs: []string{"/usr/lib/cni", "/opt/cni/bin"}}

func TestCheckNamesThePackageOrModuleOrFlagForEachMissingPrerequisite(t *testing.T) {
	for _, tc := range []struct {
		name string
		host fakeHost
		want []string // substrings of the single problem
	}{
		{"not root", fakeHost{notRoot: true}, []string{"not running as root"}},
		{"containerd down", fakeHost{dialErr: errors.New("connect: no such file or directory")},
			[]string{"/run/containerd/containerd.sock", "no such file", "Debian package containerd", "--containerd-address"}},
		{"runc missing", fakeHost{noPath: map[string]bool{"runc": true}}, []string{"runc", "Debian package runc"}},
		{"one CNI plugin missing in every dir", fakeHost{noFile: map[string]bool{"/usr/lib/cni/host-local": true, "/opt/cni/bin/host-local": true}},
			[]string{"CNI plugins host-local not found", "containernetworking-plugins", "--cni-bin-dir"}},
		{"iptables-restore missing", fakeHost{noPath: map[string]bool{"iptables-restore": true}}, []string{"iptables-restore not on PATH", "Debian package iptables"}},
		{"br_netfilter not loaded", fakeHost{kernel: map[string]KernelState{"br_netfilter": KernelLoadable}},
			[]string{"br_netfilter is not loaded", "modprobe br_netfilter", "/etc/modules-load.d"}},
		{"br_netfilter state unknown counts as not loaded", fakeHost{kernel: map[string]KernelState{"br_netfilter": KernelUnknown}},
			[]string{"modprobe br_netfilter"}},
		{"veth not in the kernel", fakeHost{kernel: map[string]KernelState{"veth": KernelMissing}}, []string{"veth", "CONFIG_VETH", "reboot"}},
		{"conntrack not in the kernel", fakeHost{kernel: map[string]KernelState{"nf_conntrack": KernelMissing}}, []string{"nf_conntrack", "CONFIG_NF_CONNTRACK"}},
		{"read-only /proc/sys", fakeHost{sysctlRO: true}, []string{"net.ipv4.ip_forward cannot be written", "unprivileged container"}},
		{"no ip_forward sysctl", fakeHost{sysctlGone: map[string]bool{IPForward: true}}, []string{"net.ipv4.ip_forward does not exist"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := Check(tc.host, cfg)
			if tc.host.sysctlRO {
				ps = ps[:1] // both sysctls are reported; the first is enough
			}
			if len(ps) != 1 {
				t.Fatalf("want one problem, got %d: %v", len(ps), ps)
			}
			for _, w := range tc.want {
				if !strings.Contains(ps[0].String(), w) {
					t.Errorf("problem %q lacks %q", ps[0], w)
				}
			}
		})
	}
}

func TestCheckPassesAHostThatHasEverything(t *testing.T) {
	if err := Run(fakeHost{}, cfg); err != nil {
		t.Fatal(err)
	}
}

func TestAutoloadedModulesThatMayLoadLaterDoNotFail(t *testing.T) {
	h := fakeHost{kernel: map[string]KernelState{"bridge": KernelLoadable, "veth": KernelUnknown, "nf_conntrack": KernelLoadable, "nf_nat": KernelUnknown}}
	if ps := Check(h, cfg); len(ps) != 0 {
		t.Fatalf("want no problem, got %v", ps)
	}
}

func TestEmptyConfigSkipsContainerdAndCNIChecks(t *testing.T) {
	h := fakeHost{dialErr: errors.New("refused"), noFile: map[string]bool{"/usr/lib/cni/bridge": true}}
	if ps := Check(h, Config{}); len(ps) != 0 {
		t.Fatalf("want no problem, got %v", ps)
	}
}

func TestEveryProblemIsReportedInOneErrorOneLineEach(t *testing.T) {
	h := fakeHost{
		dialErr: errors.New("refused"),
		noPath:  map[string]bool{"runc": true, "iptables": true, "iptables-restore": true},
		noFile: map[string]bool{"/usr/lib/cni/bridge": true, "/opt/cni/bin/bridge": true,
			"/usr/lib/cni/loopback": true, "/opt/cni/bin/loopback": true},
		kernel: map[string]KernelState{"br_netfilter": KernelLoadable, "veth": KernelMissing},
	}
	err := Run(h, cfg)
	var pe *Error
	if !errors.As(err, &pe) {
		t.Fatalf("want *Error, got %v", err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(pe.Problems) != 6 || len(lines) != 7 {
		t.Fatalf("want 6 problems on 6 lines after a header, got %d problems:\n%s", len(pe.Problems), err)
	}
	for _, w := range []string{"containerd", "Debian package runc", "bridge, loopback", "iptables and iptables-restore", "modprobe br_netfilter", "CONFIG_VETH"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%s", w, err)
		}
	}
}

func TestWarningsNameTheDataDirectoryWhenItsFilesystemIsLow(t *testing.T) {
	c := Config{DataDir: "/var/lib/starling"}
	if w := Warnings(fakeHost{}, c); len(w) != 0 {
		t.Errorf("plenty of space: %v", w)
	}
	w := Warnings(fakeHost{free: 300 << 20}, c)
	if len(w) != 1 {
		t.Fatalf("300 MiB free: %d warnings, want 1", len(w))
	}
	for _, want := range []string{"/var/lib/starling", "300 MiB free", "ENOSPC", "--data-dir"} {
		if !strings.Contains(w[0].String(), want) {
			t.Errorf("warning %q lacks %q", w[0], want)
		}
	}
	if w := Warnings(fakeHost{free: 300 << 20}, Config{}); len(w) != 0 {
		t.Errorf("no data directory given: %v", w)
	}
}

// A host with no default route cannot reach ClusterIPs from its own
// namespace (the connect fails before any rule): the agent warns and
// says what route to add.
func TestWarningsSayAHostWithoutARouteToServicesCannotReachThem(t *testing.T) {
	c := Config{ServiceCIDR: netip.MustParsePrefix("10.96.0.0/16")}
	if w := Warnings(fakeHost{}, c); len(w) != 0 {
		t.Errorf("with a route: %v", w)
	}
	w := Warnings(fakeHost{noRoute: true}, c)
	if len(w) != 1 || !strings.Contains(w[0].String(), "no route to the service range 10.96.0.0/16") || !strings.Contains(w[0].String(), "ip route add 10.96.0.0/16 dev IFACE") {
		t.Fatalf("without a route: %v", w)
	}
}
