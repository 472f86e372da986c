package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/starling-orchestrator/starling/net/service"
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
	cmd := exec.Command("nsenter", "--net=/run/netns/"+ns, self, "-rules-child", ns)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

func servicePorts(n int, gen int) []service.Port {
	ports := make([]service.Port, n)
	for i := range ports {
		ports[i] = service.Port{Service: fmt.Sprintf("default/s%d", i), Name: "http", Protocol: service.TCP,
			ClusterIP: netip.AddrFrom4([4]byte{10, 23, byte(i / 250), byte(i%250 + 1)}), Port: 80}
		for e := 0; e < 5; e++ {
			ports[i].Endpoints = append(ports[i].Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, byte(e), byte(i%250 + 2)}), 8080))
		}
	}
	// gen changes one endpoint of one Service.
	ports[0].Endpoints[0] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, 9, byte(gen%250 + 2)}), 8080)
	return ports
}

// rulesChild measures, inside the bench namespace: rule lines, full sync
// (fresh syncer: jump rules and the whole table) and one-Service-changed
// sync, medians of 3.
func rulesChild(ns string) error {
	// It flushes the nat table between runs: it must be in the test
	// namespace it was given, never in the root one.
	var self, want syscall.Stat_t
	if ns == "" || syscall.Stat("/proc/self/ns/net", &self) != nil || syscall.Stat("/run/netns/"+ns, &want) != nil || self.Ino != want.Ino {
		return fmt.Errorf("-rules-child must run inside the test network namespace it names (make bench does that)")
	}
	cfg := service.Config{ClusterCIDR: netip.MustParsePrefix("10.22.0.0/16")}
	fmt.Println("Service rules (iptables-restore in a test namespace; medians of 3)")
	fmt.Printf("%-14s %-12s %-16s %s\n", "services x eps", "rule lines", "full sync", "one Service changed")
	for _, n := range []int{100, 1000, 10000} {
		var full, one []time.Duration
		var lines int
		var failed error
		for r := 0; r < 3 && failed == nil; r++ {
			s, err := service.NewSyncer()
			if err != nil {
				return err
			}
			ports := servicePorts(n, 0)
			lines = strings.Count(string(service.Rules(ports, cfg, nil)), "\n-A ")
			start := time.Now()
			if _, failed = s.Sync(context.Background(), ports, cfg); failed != nil {
				break
			}
			full = append(full, time.Since(start))
			start = time.Now()
			if _, failed = s.Sync(context.Background(), servicePorts(n, r+1), cfg); failed != nil {
				break
			}
			one = append(one, time.Since(start))
			// Start the next run from empty tables.
			exec.Command("iptables", "-t", "nat", "-F").Run()
			exec.Command("iptables", "-t", "nat", "-X").Run()
		}
		if failed != nil {
			fmt.Printf("%-14s %-12d did not finish: %v\n", fmt.Sprintf("%d x 5", n), lines, failed)
			exec.Command("iptables", "-t", "nat", "-F").Run()
			exec.Command("iptables", "-t", "nat", "-X").Run()
			continue
		}
		fmt.Printf("%-14s %-12d %-16s %s\n", fmt.Sprintf("%d x 5", n), lines, med(full), med(one))
	}
	return nil
}

func med(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2].Round(time.Millisecond)
}
