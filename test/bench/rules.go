package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/net/xtables"
)

// rulesBench runs the Service-rules figures in a network namespace of its
// own: the bench re-executes itself there (never in the root namespace).
func rulesBench() error {
	ns := fmt.Sprintf("stbench-rules-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+ns, self, "-rules-child", ns, "-rules-backends", rulesBackends)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

func servicePorts(n int) []service.Port {
	ports := make([]service.Port, n)
	for i := range ports {
		ports[i] = service.Port{Service: fmt.Sprintf("default/s%d", i), Name: "http", Protocol: service.TCP,
			ClusterIP: netip.AddrFrom4([4]byte{10, 23, byte(i / 250), byte(i%250 + 1)}), Port: 80}
		if i%10 == 0 { // one in ten is a NodePort Service
			ports[i].NodePort = uint16(30000 + i/10)
		}
		for e := 0; e < 5; e++ {
			ports[i].Endpoints = append(ports[i].Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, byte(e), byte(i%250 + 2)}), 8080))
		}
	}
	return ports
}

// rulesChild measures, inside the bench namespace, medians of 5 runs of
// the agent's Syncer over servicePorts (one in ten with a NodePort): a
// full sync (fresh syncer: jump rules and the whole table), a restart (a
// new Syncer's full sync over the same table), one Service changed (its
// port number: a dispatch rule replaced) and one endpoint changed (an
// address replaced), end to end through SyncServices given the changed
// Service, as the agent's services loop calls it; and, for the
// one-endpoint change, the time to find the change (Model.UpdateServices)
// and to render it, without the kernel.
func rulesChild(ns string) error {
	// It flushes the nat table between runs: it must be in the test
	// namespace it was given, never in the root one.
	var self, want syscall.Stat_t
	if ns == "" || syscall.Stat("/proc/self/ns/net", &self) != nil || syscall.Stat("/run/netns/"+ns, &want) != nil || self.Ino != want.Ino {
		return fmt.Errorf("-rules-child must run inside the test network namespace it names (make bench does that)")
	}
	cfg := service.Config{ClusterCIDR: netip.MustParsePrefix("10.22.0.0/16")}
	how := map[string]string{"iptables": "iptables-restore --noflush", "nftables": "the ip starling table over netlink"}
	for i, b := range strings.Split(rulesBackends, ",") {
		if how[b] == "" {
			return fmt.Errorf("-rules-backends: %q is not iptables or nftables", b)
		}
		if i > 0 {
			fmt.Println()
		}
		if err := rulesFigures(b, how[b], cfg); err != nil {
			return err
		}
	}
	return nil
}

// rulesBackends are the backends the rules group measures (-rules-backends).
var rulesBackends string

// rulesFigures prints the figures of one backend.
func rulesFigures(backend, how string, cfg service.Config) error {
	newSyncer := func() (*service.Syncer, error) { return service.NewSyncer(xtables.Plain) }
	clean := func() {
		exec.Command("iptables", "-t", "nat", "-F").Run()
		exec.Command("iptables", "-t", "nat", "-X").Run()
	}
	if backend == "nftables" {
		newSyncer = func() (*service.Syncer, error) { return service.NewNFTSyncer(nil) }
		clean = func() { service.RemoveNFT() }
	}
	fmt.Printf("Service rules, %s backend (%s in a test namespace; medians of 5)\n", backend, how)
	fmt.Printf("%-14s %-11s %-11s %-11s %-20s %-20s %s\n", "services x eps", "rule lines", "full sync", "restart", "one Service changed", "one endpoint changed", "generation (find + render)")
	for _, n := range []int{100, 1000, 10000} {
		var full, restart, svc, ep []time.Duration
		var find, render time.Duration
		var failed error
		lines := strings.Count(string(service.Rules(servicePorts(n), cfg)), "\n-A ")
		if backend == "nftables" {
			lines = nftRuleLines(service.NFTText(servicePorts(n), cfg))
		}
		for r := 0; r < 5 && failed == nil; r++ {
			s, err := newSyncer()
			if err != nil {
				return err
			}
			ports := servicePorts(n)
			// As the agent's services loop does: the changed Services
			// (nil on a full sync), every port when a full sync is due.
			step := func(into *[]time.Duration, changed ...int) {
				if failed != nil {
					return
				}
				svcs := map[string][]service.Port{}
				for _, i := range changed {
					svcs[ports[i].Service] = []service.Port{ports[i]}
				}
				start := time.Now()
				if _, failed = s.SyncServices(context.Background(), svcs, func() []service.Port { return ports }, cfg); failed == nil {
					*into = append(*into, time.Since(start))
				}
			}
			step(&full)
			// A restarted agent: a new Syncer's first sync over the
			// same table, in place.
			if s, err = newSyncer(); err != nil {
				return err
			}
			step(&restart)
			ports[n/2].Port = 81
			step(&svc, n/2)
			ports[n/3].Endpoints = slices.Clone(ports[n/3].Endpoints)
			ports[n/3].Endpoints[0] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, 9, byte(r + 2)}), 8080)
			step(&ep, n/3)
			if r == 0 {
				ports[n/3].Endpoints[0] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, 9, 200}), 8080)
				find, render = generation(ports, cfg, n/3, backend)
			}
			// Start the next run from empty tables.
			clean()
		}
		if failed != nil {
			fmt.Printf("%-14s %-11d did not finish: %v\n", fmt.Sprintf("%d x 5", n), lines, failed)
			clean()
			continue
		}
		gen := fmt.Sprintf("%v + %v", find, render)
		fmt.Printf("%-14s %-11d %-11s %-11s %-20s %-20s %s\n", fmt.Sprintf("%d x 5", n), lines, med(full), med(restart), med(svc), med(ep), gen)
	}
	return nil
}

// nftRuleLines counts the rules of a table in nft syntax: the lines of
// its chains, base chain declarations aside.
func nftRuleLines(text []byte) int {
	n, inChain := 0, false
	for _, line := range strings.Split(string(text), "\n") {
		switch t := strings.TrimSpace(line); {
		case strings.HasPrefix(t, "chain "):
			inChain = true
		case t == "}":
			inChain = false
		case inChain && t != "" && !strings.HasPrefix(t, "type "):
			n++
		}
	}
	return n
}

func med(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2].Round(100 * time.Microsecond)
}

// generation times, without the kernel, the two parts of generating a
// one-endpoint change of port i: finding it (Model.UpdateServices given
// the changed Service, as the agent's services loop gives it) and
// rendering it (service.ChangeText, or service.NFTChange: the chains and
// elements the netlink messages are made from); medians of 21 changes
// to one long-lived model, as the agent keeps one.
func generation(ports []service.Port, cfg service.Config, i int, backend string) (find, render time.Duration) {
	var finds, renders []time.Duration
	var m service.Model
	m.Update(ports, cfg)
	m.UpdateServices(nil, cfg) // the model's index by Service, as after the agent's first change
	for r := 0; r < 21; r++ {
		ports[i].Endpoints = slices.Clone(ports[i].Endpoints)
		ports[i].Endpoints[1] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, 8, byte(r + 2)}), 8080)
		start := time.Now()
		c := m.UpdateServices(map[string][]service.Port{ports[i].Service: {ports[i]}}, cfg)
		finds = append(finds, time.Since(start))
		start = time.Now()
		if backend == "nftables" {
			service.NFTChange(c, cfg)
		} else {
			service.ChangeText(c, cfg)
		}
		renders = append(renders, time.Since(start))
	}
	return medExact(finds), medExact(renders)
}

func medExact(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Microsecond)
}
