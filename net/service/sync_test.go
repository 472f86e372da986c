package service

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/starling-orchestrator/starling/net/netnstest"
	"github.com/starling-orchestrator/starling/net/xtables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// inNewNetns runs f in a network namespace of its own (netnstest.Run).
// It skips without root or iptables.
func inNewNetns(t *testing.T, f func() error) {
	t.Helper()
	for _, c := range []string{"iptables", "iptables-restore"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("%s: %v", c, err)
		}
	}
	netnstest.Run(t, func(*netnstest.NS) error { return f() })
}

// vethUp adds a veth pair of name and peer to the current network
// namespace and sets both ends up.
func vethUp(name, peer string) (*netlink.Veth, error) {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, err
	}
	for _, n := range []string{name, peer} {
		l, err := netlink.LinkByName(n)
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		if err != nil {
			return nil, err
		}
	}
	return veth, nil
}

// kernelPortChains counts the per-port chains of the nat table.
func kernelPortChains(s *Syncer) (int, error) {
	chains, err := s.b.(xt).t.natChains()
	n := 0
	for _, c := range chains {
		if isServiceChain(c) {
			n++
		}
	}
	return n, err
}

// In a real kernel, through iptables-restore: after 1,000 cycles of
// creating and deleting Services and endpoints the nat table holds exactly
// the per-port chains the model does (deleted ones were re-created and
// deleted on every later sync before).
func TestSyncerChainsFollowTheModelInTheKernel(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	inNewNetns(t, func() error {
		s, err := NewSyncer(xtables.Plain)
		if err != nil {
			return err
		}
		base := benchPorts(3)
		for cycle := 0; cycle < 1000; cycle++ {
			extra := Port{Service: fmt.Sprintf("default/cycle%d", cycle), Name: "p", Protocol: TCP, ClusterIP: netip.MustParseAddr("10.23.1.1"), Port: 80,
				NodePort: 31000, Endpoints: addrPorts(fmt.Sprintf("10.22.3.%d:80", 2+cycle%200), "10.22.4.2:80")}
			for _, ports := range [][]Port{append(append([]Port(nil), base...), extra), base} {
				if _, err := s.Sync(context.Background(), ports, cfg); err != nil {
					return fmt.Errorf("cycle %d: %w", cycle, err)
				}
				got, err := kernelPortChains(s)
				if err != nil {
					return err
				}
				if want := modelChains(&s.model); got != want {
					return fmt.Errorf("cycle %d: the nat table holds %d per-port chains, the model %d", cycle, got, want)
				}
			}
		}
		return nil
	})
}

// A restarted agent (a new Syncer, on tables an earlier run programmed)
// removes on its first sync what went away while it was down: per-port
// chains, and UDP conntrack entries NATed to endpoints that are gone
// (else a client keeps its flow to a removed pod). Entries to endpoints
// still there, and flows that were not NATed, stay.
func TestRestartedSyncerRemovesWhatWentAwayWhileDown(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	inNewNetns(t, func() error {
		// Endpoints behind a veth: packets to them leave (and nobody
		// answers), after conntrack has its entries.
		dummy, err := vethUp("ep0", "ep1")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("10.22.1.1/24")
		if err := netlink.AddrAdd(dummy, addr); err != nil {
			return err
		}
		// A route for the ClusterIPs (the pod network gives a default
		// route to pods; this namespace is the test's own).
		_, svcNet, _ := net.ParseCIDR("10.23.0.0/16")
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: dummy.Attrs().Index, Dst: svcNet}); err != nil {
			return err
		}
		dns := Port{Service: "kube-system/dns", Name: "dns", Protocol: UDP, ClusterIP: netip.MustParseAddr("10.23.0.53"), Port: 53,
			Endpoints: addrPorts("10.22.1.5:53", "10.22.1.6:53")}
		web := webPort("10.22.1.7:8080")
		first, err := NewSyncer(xtables.Plain)
		if err != nil {
			return err
		}
		if _, err := first.Sync(context.Background(), []Port{dns, web}, cfg); err != nil {
			return err
		}
		// Flows through the Service to both endpoints (random choice: 40
		// sockets), and one straight to 10.22.1.5.
		for i := 0; i < 40; i++ {
			send("10.23.0.53:53")
		}
		send("10.22.1.5:53")
		before := udpFlowsTo()
		if before["10.22.1.5 nat"] == 0 || before["10.22.1.6 nat"] == 0 || before["10.22.1.5 direct"] != 1 {
			return fmt.Errorf("flows before: %v, want NATed ones to both endpoints and one direct", before)
		}
		// The agent stops; 10.22.1.5 and the web Service go meanwhile.
		dns.Endpoints = addrPorts("10.22.1.6:53")
		again, err := NewSyncer(xtables.Plain)
		if err != nil {
			return err
		}
		if _, err := again.Sync(context.Background(), []Port{dns}, cfg); err != nil {
			return err
		}
		after := udpFlowsTo()
		if after["10.22.1.5 nat"] != 0 || after["10.22.1.6 nat"] != before["10.22.1.6 nat"] || after["10.22.1.5 direct"] != 1 {
			return fmt.Errorf("flows after the restart: %v (before %v), want none NATed to 10.22.1.5 and the others kept", after, before)
		}
		got, err := kernelPortChains(again)
		if err != nil {
			return err
		}
		if want := modelChains(&again.model); got != want {
			return fmt.Errorf("after the restart the nat table holds %d per-port chains, the model %d", got, want)
		}
		return nil
	})
}

// send sends one UDP datagram to addr from a socket of its own.
func send(addr string) {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return
	}
	c.Write([]byte("q"))
	c.Close()
}

// udpFlowsTo counts this namespace's UDP conntrack entries by reply
// source and whether they were NATed ("10.22.1.5 nat").
func udpFlowsTo() map[string]int {
	flows, _ := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	out := map[string]int{}
	for _, f := range flows {
		if f.Forward.Protocol != unix.IPPROTO_UDP {
			continue
		}
		kind := "direct"
		if !f.Forward.DstIP.Equal(f.Reverse.SrcIP) {
			kind = "nat"
		}
		out[f.Reverse.SrcIP.String()+" "+kind]++
	}
	return out
}
