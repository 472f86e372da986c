package podnet

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/net/netnstest"
	"github.com/vishvananda/netlink"
)

// pluginsWithSlowAdd returns a plugin directory whose bridge plugin waits
// a second before it adds (after touching started), in front of the
// host's plugins.
func pluginsWithSlowAdd(t *testing.T, started string) string {
	return pluginsWithAdd(t, fmt.Sprintf("touch %s; sleep 1", started))
}

// pluginsWithAdd returns a plugin directory whose bridge plugin runs the
// shell commands onAdd before it adds, in front of the host's plugins.
func pluginsWithAdd(t *testing.T, onAdd string) string {
	t.Helper()
	var real string
	for _, d := range DefaultPluginDirs {
		if _, err := os.Stat(filepath.Join(d, "bridge")); err == nil {
			real = d
			break
		}
	}
	if real == "" {
		t.Skip("no CNI plugins (Debian package containernetworking-plugins)")
	}
	dir := t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$CNI_COMMAND\" = ADD ]; then %s; fi\nexec %s \"$@\"\n", onAdd, filepath.Join(real, "bridge"))
	if err := os.WriteFile(filepath.Join(dir, "bridge"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"host-local", "loopback"} {
		if err := os.Symlink(filepath.Join(real, p), filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// inNetwork runs f in a network namespace of its own (netnstest.Run)
// with a Network of bridge on the pod subnet 10.99.1.0/24 of the cluster
// 10.99.0.0/16, its CNI plugins in plugins; moved is the subnet a test
// moves it to, 10.99.2.0/24.
func inNetwork(t *testing.T, bridge, plugins string, f func(ns *netnstest.NS, n *Network, moved *net.IPNet) error) {
	t.Helper()
	_, cluster, _ := net.ParseCIDR("10.99.0.0/16")
	_, old, _ := net.ParseCIDR("10.99.1.0/24")
	_, moved, _ := net.ParseCIDR("10.99.2.0/24")
	dir := t.TempDir()
	netnstest.Run(t, func(ns *netnstest.NS) error {
		n, err := New(Config{DataDir: dir, Bridge: bridge, PodSubnet: old, ClusterCIDR: cluster, PluginDirs: []string{plugins}})
		if err != nil {
			return err
		}
		return f(ns, n, moved)
	})
}

// A subnet that moves while a sandbox is being attached ends with the
// bridge on the new subnet's gateway. (The attach in flight ran the
// bridge plugin with the old configuration after SetSubnet had moved the
// bridge, and the plugin, told to force its address, put the old gateway
// back: the node's pods lost their gateway until the next attach.)
func TestSubnetMoveDuringAttachLeavesTheNewGateway(t *testing.T) {
	started := filepath.Join(t.TempDir(), "add-started")
	plugins := pluginsWithSlowAdd(t, started)
	inNetwork(t, "sttest0", plugins, func(ns *netnstest.NS, n *Network, moved *net.IPNet) error {
		ctx := context.Background()
		defer n.Detach(ctx, "first")  //nolint:errcheck // cleanup
		defer n.Detach(ctx, "second") //nolint:errcheck
		if _, err := n.Attach(ctx, "first"); err != nil {
			return err
		}
		os.Remove(started)
		attached := ns.Go(func() error { _, err := n.Attach(ctx, "second"); return err })
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(started); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the second attach did not start its bridge plugin")
			}
		}
		moveErr := <-ns.Go(func() error { return n.SetSubnet(moved) })
		if err := <-attached; err != nil {
			return fmt.Errorf("second attach: %w", err)
		}
		if moveErr != nil {
			return fmt.Errorf("SetSubnet: %w", moveErr)
		}
		br, err := netlink.LinkByName("sttest0")
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(br, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		if len(addrs) != 1 || addrs[0].IPNet.String() != "10.99.2.1/24" {
			return fmt.Errorf("bridge addresses after the move: %v, want only 10.99.2.1/24", addrs)
		}
		return nil
	})
}

// A CNI plugin that hangs on ADD ends after attachTimeout: the attach
// fails, leaves nothing behind, and lets a subnet move (which waits for
// the attaches in flight) go on; it held the attach lock for as long as
// the plugin hung.
func TestHungPluginReleasesTheAttachLock(t *testing.T) {
	plugins := pluginsWithAdd(t, "exec sleep 600")
	defer func(d time.Duration) { attachTimeout = d }(attachTimeout)
	attachTimeout = time.Second
	inNetwork(t, "sttest1", plugins, func(ns *netnstest.NS, n *Network, moved *net.IPNet) error {
		start := time.Now()
		if _, err := n.Attach(context.Background(), "hung"); err == nil {
			return fmt.Errorf("an attach whose plugin hangs succeeded")
		}
		if took := time.Since(start); took > 10*time.Second {
			return fmt.Errorf("the attach took %v, want about attachTimeout (1 s)", took)
		}
		if _, err := os.Stat(n.NetNSPath("hung")); !os.IsNotExist(err) {
			return fmt.Errorf("the failed attach left its namespace behind (%v)", err)
		}
		moving := ns.Go(func() error { return n.SetSubnet(moved) })
		select {
		case err := <-moving:
			return err
		case <-time.After(10 * time.Second):
			return fmt.Errorf("SetSubnet still waits 10 s after the hung attach failed")
		}
	})
}
