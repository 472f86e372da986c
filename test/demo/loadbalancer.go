package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// lbPool is the demo's LoadBalancer pool: a range of the LAN namespace's
// subnet that holds no node (.11 to .13) nor the LAN's own address.
const lbPool = harness.LANPrefix + ".240/28"

// loadBalancer gives the cluster its pool, shows hello-lb's address
// (examples/hello/loadbalancer.yaml, applied with the rest) answering
// the LAN, cuts off the node that announces it, times the address
// answering again from another node, and brings the node back.
func (s *scenario) loadBalancer() error {
	n1 := s.c.Nodes[0]
	s.r.say(`examples/hello/loadbalancer.yaml is a LoadBalancer Service "hello-lb", still without an
address: the cluster has no pool yet. Given one, every node computes the same address for it
and one node, chosen by the same hashing as placement, puts it on its LAN interface and
announces it (gratuitous ARP).`)
	if _, err := s.r.run(n1, "cluster", "lb-pool", lbPool); err != nil {
		return err
	}
	var addr netip.Addr
	if err := poll(30*time.Second, func() error {
		out, err := n1.CLI("get", "services", "hello-lb", "-o", "json")
		if err != nil {
			return err
		}
		var svc struct {
			Status struct {
				LoadBalancer struct{ Ingress []struct{ IP string } }
			}
		}
		if err := json.Unmarshal([]byte(out), &svc); err != nil || len(svc.Status.LoadBalancer.Ingress) != 1 {
			return fmt.Errorf("hello-lb has no address yet: %v", err)
		}
		addr, err = netip.ParseAddr(svc.Status.LoadBalancer.Ingress[0].IP)
		return err
	}); err != nil {
		return err
	}
	if _, err := s.r.run(n1, "get", "services"); err != nil {
		return err
	}
	url := "http://" + addr.String() + "/"
	var owner *harness.Node
	if err := poll(30*time.Second, func() error {
		if owner = s.holder(addr); owner == nil {
			return fmt.Errorf("no node holds %s", addr)
		}
		_, err := harness.HTTPGet(s.c.LAN, url, time.Second)
		return err
	}); err != nil {
		return err
	}
	body, _ := harness.HTTPGet(s.c.LAN, url, time.Second)
	a := parseAnswer(body)
	s.r.say("GET %s from the LAN: answered by %s (%s); %s holds the address.", url, a.hostname, s.nodeOf(a.hostname), owner.Name)
	s.r.say("Cut %s off (its link down, its agent killed) and ask again every 100 ms:", owner.Name)
	cut := time.Now()
	if err := owner.CutOff(); err != nil {
		return err
	}
	var next *harness.Node
	if err := poll(30*time.Second, func() error {
		if _, err := harness.HTTPGet(s.c.LAN, url, 300*time.Millisecond); err != nil {
			return err
		}
		if next = s.holder(addr); next == nil || next == owner {
			return fmt.Errorf("the address is not on another node yet")
		}
		return nil
	}); err != nil {
		return err
	}
	took := time.Since(cut)
	body, _ = harness.HTTPGet(s.c.LAN, url, time.Second)
	a = parseAnswer(body)
	s.r.say("%s answers again %s after the cut, from %s (answered by %s): the other nodes found\n%s dead (about 5 s, memberlist's defaults) and the next node in hashing order took\nthe address, with no coordinator.", addr, round(took), next.Name, a.hostname, owner.Name)
	s.r.say("%s comes back (its link up, its agent restarted) and the cluster settles again.", owner.Name)
	if err := owner.Reconnect(); err != nil {
		return err
	}
	return poll(180*time.Second, func() error {
		if err := s.settle(s.c.Nodes, 0); err != nil {
			return err
		}
		if h := s.holder(addr); h == nil {
			return fmt.Errorf("no node holds %s", addr)
		}
		_, err := harness.HTTPGet(s.c.LAN, url, time.Second)
		return err
	})
}

// holder is the node whose LAN interface is up and holds a (nil: none).
func (s *scenario) holder(a netip.Addr) *harness.Node {
	for _, n := range s.c.Nodes {
		link, err := harness.NetNSExec(context.Background(), n.NetNS, "ip", "-o", "link", "show", "dev", "eth0")
		if err != nil || !strings.Contains(link, "state UP") {
			continue
		}
		out, err := harness.NetNSExec(context.Background(), n.NetNS, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if err == nil && strings.Contains(out, " "+a.String()+"/32 ") {
			return n
		}
	}
	return nil
}
