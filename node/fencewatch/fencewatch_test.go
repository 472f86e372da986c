package fencewatch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestWatchdogTakesLapsedAddressesOffAgain (root, in a network namespace
// of its own): past the lease's LB deadline the watchdog takes the listed
// addresses off, and again if a half-hung agent puts one back, at every
// look while the lease stays lapsed (once only before).
func TestWatchdogTakesLapsedAddressesOffAgain(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace)")
	}
	dir := t.TempDir()
	lease := filepath.Join(dir, LeaseFile)
	b, _ := json.Marshal(Lease{Deadline: time.Now().Add(time.Hour), LBDeadline: time.Now().Add(-time.Second)})
	os.WriteFile(lease, b, 0o600)
	os.WriteFile(filepath.Join(dir, LBAddressesFile), []byte("192.168.50.240\n"), 0o600)
	lb, _ := netlink.ParseAddr("192.168.50.240/32")
	ns, readded, done := make(chan int, 1), make(chan error, 1), make(chan string, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare: %v", err)
			close(ns)
			return
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lan0"}, PeerName: "lan1"}
		self, _ := netlink.ParseAddr("192.168.50.11/24")
		if err := netlink.LinkAdd(veth); err != nil || netlink.AddrAdd(veth, self) != nil || netlink.AddrAdd(veth, lb) != nil {
			t.Errorf("veth lan0 and its addresses: %v", err)
			close(ns)
			return
		}
		fd, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Errorf("open the namespace: %v", err)
			close(ns)
			return
		}
		ns <- fd
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		Run(ctx, lease, slog.New(slog.NewTextHandler(io.Discard, nil)))
		addrs, _ := netlink.AddrList(veth, netlink.FAMILY_V4)
		var on []string
		for _, a := range addrs {
			on = append(on, a.IP.String())
		}
		done <- strings.Join(on, " ")
	}()
	fd, ok := <-ns
	if !ok {
		return
	}
	defer unix.Close(fd)
	go func() {
		runtime.LockOSThread() // never unlocked, as above
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			readded <- err
			return
		}
		time.Sleep(time.Second) // the watchdog took it off by now
		link, err := netlink.LinkByName("lan0")
		if err == nil {
			err = netlink.AddrAdd(link, lb) // EEXIST: it was never taken off
		}
		readded <- err
	}()
	if err := <-readded; err != nil {
		t.Fatalf("putting the address back, as a half-hung agent would: %v", err)
	}
	if on := <-done; strings.Contains(on, "192.168.50.240") {
		t.Errorf("the lease lapsed: the interface still holds %s, want the address put back taken off again", on)
	}
}
