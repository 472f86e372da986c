package node

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/dataplane"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/test/harness"
)

// syncBuffer is a bytes.Buffer safe for the dry-run loop and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestDryRunPrintsSubnetRoutesAndServiceRulesAndTakesNothing(t *testing.T) {
	a0 := start(t, "a0", t.TempDir(), nil)
	waitSubnetSettled(t, a0, 10*time.Second)
	deploy(t, a0, "web", 1, "img:v1")
	storeObjects(t, a0, testService(t, harness.App{Name: "web"}, "web", []corev1.ServicePort{harness.ServicePort(80, "8080")}))

	out := &syncBuffer{}
	dry := start(t, "dry", t.TempDir(), []string{a0.addr()}, func(c *testSetup) { c.DryRun, c.dryRunOut, c.ProxyMode = true, out, dataplane.ProxyIptables })
	a0Subnet := a0.agent.own.subnets.current().Subnet
	wantDNAT := "-j DNAT --to-destination " + a0.rt.podIP(1) + ":8080"
	wantRoute := fmt.Sprintf("ip route replace %s via 127.0.0.1 proto 87\n", a0Subnet)
	waitFor(t, 20*time.Second, func() error {
		s := out.String()
		for _, want := range []string{"pod subnet this node would claim", wantRoute, "Service rules this node would apply (1 service ports)",
			wantDNAT, "iptables -t nat -A PREROUTING", "COMMIT\n"} {
			if !strings.Contains(s, want) {
				return fmt.Errorf("dry-run output lacks %q:\n%s", want, s)
			}
		}
		return nil
	})
	claim := dry.agent.own.subnets.current().Subnet
	if claim == "" || claim == a0Subnet || !strings.Contains(out.String(), "\n"+claim+"\n") {
		t.Fatalf("dry run would claim %q (a0 holds %s):\n%s", claim, a0Subnet, out)
	}

	// Peers see no record of it, so no claim, no route and no replica: all
	// three replicas stay on a0, though placement spreads them while there
	// are nodes enough.
	deploy(t, a0, "web", 3, "img:v1")
	waitFor(t, 10*time.Second, func() error { return runningEverywhere([]*testNode{a0, dry}, "web", 3) })
	if got := len(a0.rt.ids()); got != 3 {
		t.Fatalf("a0 runs %d replicas, want all 3", got)
	}
	if storedValue(a0, view.StatusKey("dry")) != "" {
		t.Fatal("a0 holds a node record of the dry-run node")
	}
	for _, c := range a0.agent.own.subnets.others() {
		t.Fatalf("a0 sees a subnet claim: %+v", c)
	}
	if dry.rt.created != 0 || dry.agent.own.subnets.settled.Load() {
		t.Fatalf("dry-run node created %d containers, subnet ready %v", dry.rt.created, dry.agent.own.subnets.settled.Load())
	}

	// A change is printed again: the Service deleted, its rules go; the
	// unchanged sections are not repeated.
	routesPrinted := strings.Count(out.String(), "routes this node would install")
	recs, err := a0.agent.store.List(view.KindPrefix(manifest.KindService))
	if err != nil || len(recs) != 1 {
		t.Fatalf("service records: %v %v", recs, err)
	}
	a0.agent.clock.Update(recs[0].Version)
	if err := a0.agent.mem.writer.publish(crdt.Record{Key: recs[0].Key, Version: a0.agent.clock.Now(), Origin: "a0", Deleted: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() error {
		if !strings.Contains(out.String(), "Service rules this node would apply (0 service ports)") {
			return fmt.Errorf("no new rules section after the delete:\n%s", out)
		}
		return nil
	})
	if n := strings.Count(out.String(), "routes this node would install"); n != routesPrinted {
		t.Fatalf("unchanged routes printed again (%d times, was %d):\n%s", n, routesPrinted, out)
	}
}

func TestDryRunRepublishesAReadyRecordOfItsNameAsNotReady(t *testing.T) {
	a0 := start(t, "a0", t.TempDir(), nil)
	dir := t.TempDir()
	a1 := start(t, "a1", dir, []string{a0.addr()})
	waitFor(t, 10*time.Second, func() error {
		if v := a0.agent.views.View(); !v.Statuses["a1"].SubnetReady {
			return fmt.Errorf("a0 does not see a1 ready yet")
		}
		return nil
	})
	subnet := a1.agent.own.subnets.current().Subnet
	a1.stop()
	out := &syncBuffer{}
	start(t, "a1", dir, []string{a0.addr()}, func(c *testSetup) { c.DryRun, c.dryRunOut = true, out })
	waitFor(t, 10*time.Second, func() error {
		if s := a0.agent.views.View().Statuses["a1"]; s.SubnetReady || s.PodSubnet != subnet {
			return fmt.Errorf("a0 sees a1 as %+v, want not ready, subnet %s", s, subnet)
		}
		return nil
	})
	// The subnet kept from the real run is what it would claim.
	waitFor(t, 10*time.Second, func() error {
		if !strings.Contains(out.String(), "\n"+subnet+"\n") {
			return fmt.Errorf("dry run does not show the kept subnet %s:\n%s", subnet, out)
		}
		return nil
	})
}

// In nftables mode the dry run prints the table the agent would write,
// in nft syntax.
func TestDryRunPrintsTheNFTablesTableInNftablesMode(t *testing.T) {
	out := &syncBuffer{}
	p := newPrinter(out)
	p.nft = dryRunNFT(context.Background(), dataplane.ProxyNftables)
	ports := []service.Port{{Service: "default/web", Name: "http", Protocol: service.TCP, ClusterIP: netip.MustParseAddr("10.23.0.10"), Port: 80,
		NodePort: 30080, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.22.1.5:8080")}}}
	if _, err := p.Sync(context.Background(), ports, service.Config{ClusterCIDR: netip.MustParsePrefix("10.22.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"over netlink as this nftables table", "table ip starling {", "10.23.0.10 . tcp . 80 : goto service-",
		"tcp . 30080 : goto external-", "10.23.0.10 . tcp . 80 . 0 : 10.22.1.5 . 8080", "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 1 map @service-endpoints", "ip saddr != 10.22.0.0/16 jump mark-for-masquerade"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
}
