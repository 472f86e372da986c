package preflight

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// System is the Host of the running process: it reads /proc, /sys,
// /boot and /lib/modules, looks up PATH and dials sockets, and changes
// nothing.
type System struct {
	once     sync.Once
	release  string
	config   map[string]string // kernel build options; nil: not readable
	modules  []byte            // modules.dep of the running kernel; nil: not readable
	builtins []byte            // modules.builtin
}

var _ Host = (*System)(nil)

// HasRoute is Host.HasRoute: a route lookup in the current network
// namespace (RTM_GETROUTE, as 'ip route get').
func (s *System) HasRoute(ip netip.Addr) bool {
	_, err := netlink.RouteGet(ip.AsSlice())
	return err == nil
}

// FreeBytes is Host.FreeBytes: statfs of path, or of its nearest
// existing parent (the data directory may not exist yet).
func (s *System) FreeBytes(path string) (uint64, error) {
	for {
		var st unix.Statfs_t
		err := unix.Statfs(path, &st)
		if err == nil {
			return st.Bavail * uint64(st.Bsize), nil
		}
		parent := filepath.Dir(path)
		if err != unix.ENOENT || parent == path {
			return 0, err
		}
		path = parent
	}
}

func (s *System) IsRoot() bool { return os.Geteuid() == 0 }

func (s *System) DialUnix(path string) error {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

func (s *System) LookPath(name string) bool {
	_, err := exec.LookPath(name)
	return err == nil
}

func (s *System) Executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// Sysctl checks writability with access(2), which reports EROFS for a
// read-only /proc/sys without writing anything.
func (s *System) Sysctl(path string) (exists, writable bool) {
	if _, err := os.Stat(path); err != nil {
		return false, false
	}
	return true, unix.Access(path, unix.W_OK) == nil
}

// Kernel looks for evidence that the feature is active (/sys/module, or
// one of f.Evidence), then at the kernel's build options (/boot/config-
// <release> or /proc/config.gz: =y built in, =m a module) and its module
// lists (/lib/modules/<release>/modules.dep, modules.builtin). Built-in
// code has no /sys/module entry unless it has parameters, hence the
// build options. Where a list is unreadable (a container without
// /lib/modules, whose kernel may still load modules from the host's) it
// answers KernelUnknown rather than guess.
func (s *System) Kernel(f Feature) KernelState {
	for _, p := range f.Evidence {
		if exists(p) {
			return KernelActive
		}
	}
	if f.MustBeLoaded {
		// Only the evidence (the feature's sysctls in this network
		// namespace) shows it usable.
		if s.missing(f) {
			return KernelMissing
		}
		return KernelLoadable
	}
	if exists("/sys/module/" + f.Module) {
		return KernelActive
	}
	s.once.Do(s.load)
	if s.config != nil && s.config[f.Config] == "y" || bytes.Contains(s.builtins, []byte("/"+f.Module+".ko")) {
		return KernelActive
	}
	if bytes.Contains(s.modules, []byte("/"+f.Module+".ko")) {
		return KernelLoadable
	}
	if s.missing(f) {
		return KernelMissing
	}
	return KernelUnknown
}

// missing reports whether the kernel certainly lacks f: its build options
// leave it out, or make it a module that the module list of the running
// kernel does not have (a kernel upgraded without a reboot).
func (s *System) missing(f Feature) bool {
	s.once.Do(s.load)
	if s.config == nil {
		return false
	}
	switch s.config[f.Config] {
	case "y":
		return false
	case "m":
		return s.modules != nil && !bytes.Contains(s.modules, []byte("/"+f.Module+".ko"))
	default:
		return true
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func (s *System) load() {
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		s.release = unix.ByteSliceToString(u.Release[:])
	}
	s.config = readKernelConfig(s.release)
	dir := "/lib/modules/" + s.release
	if b, err := os.ReadFile(dir + "/modules.dep"); err == nil {
		s.modules = b
	}
	if b, err := os.ReadFile(dir + "/modules.builtin"); err == nil {
		s.builtins = b
	}
}

// readKernelConfig reads CONFIG_X=y|m lines; nil when no config is found.
func readKernelConfig(release string) map[string]string {
	var r io.Reader
	if f, err := os.Open("/boot/config-" + release); err == nil {
		defer f.Close()
		r = f
	} else if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil
		}
		r = zr
	} else {
		return nil
	}
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			out[k] = v
		}
	}
	if sc.Err() != nil {
		return nil
	}
	return out
}
