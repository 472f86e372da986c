// Package netnstest runs test code in a network namespace of its own, so
// that tests may create bridges, addresses and rules without touching
// the host's. It is for tests only.
package netnstest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NS is a network namespace made by Run, open for more threads to join
// (Go).
type NS struct {
	fd int
}

// Run runs f on an OS thread moved into a new network namespace (with lo
// up), which goes when the last thread in it exits: the threads are never
// unlocked, so the runtime ends them. Commands f starts run in that
// namespace; Run checks that before f may touch anything. It skips
// without root, and fails the test on f's error.
func Run(t *testing.T, f func(ns *NS) error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace of its own)")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		root, err := os.Readlink("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		self, _ := os.Readlink("/proc/thread-self/ns/net")
		child, err := exec.Command("readlink", "/proc/self/ns/net").Output()
		if self == root || err != nil || strings.TrimSpace(string(child)) != self {
			errc <- fmt.Errorf("not in a namespace of its own (root %s, thread %s, child %s, %v): refusing to go on", root, self, child, err)
			return
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			errc <- fmt.Errorf("lo up: %w", err)
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		errc <- f(&NS{fd: fd})
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// Go runs f on another OS thread in the namespace and returns f's error
// on the channel when it ends. Call it from within Run's f, before f
// returns.
func (ns *NS) Go(f func() error) <-chan error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see Run
		if err := unix.Setns(ns.fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		errc <- f()
	}()
	return errc
}
