package node

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/announce"
)

// fakeLink is an announce.Link in memory: the addresses it holds.
type fakeLink struct {
	mu   sync.Mutex
	held []netip.Addr
}

func (l *fakeLink) Held() ([]netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.held), nil
}

func (l *fakeLink) Add(a netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !slices.Contains(l.held, a) {
		l.held = append(l.held, a)
	}
	return nil
}

func (l *fakeLink) Remove(a netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = slices.DeleteFunc(l.held, func(b netip.Addr) bool { return a == b })
	return nil
}

func (l *fakeLink) Announce(netip.Addr) error { return nil }

// TestLoadBalancerAddressFromThePool: three agents give a LoadBalancer
// Service the same address of the pool set as a cluster setting, in its
// ports; one of them (its announcer on a fake link, asking its fence for
// the majority) holds it; when that node stops, another takes it; a new
// pool moves the address.
func TestLoadBalancerAddressFromThePool(t *testing.T) {
	nodes := startCluster(t, 3)
	applyYAML(t, nodes[0], "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lb-pool, namespace: starling-system}\ndata: {cidr: 192.0.2.240/28}\n")
	applyYAML(t, nodes[0], "apiVersion: v1\nkind: Service\nmetadata: {name: lb}\nspec:\n  type: LoadBalancer\n  selector: {app: web}\n  ports: [{port: 80, targetPort: 8080}]\n")
	addrOf := func(n *testNode) (netip.Addr, error) {
		v := n.agent.views.View()
		a, ok := v.Alloc.LoadBalancers["default/lb"]
		if !ok {
			return a, fmt.Errorf("%s: no address yet", n.name)
		}
		ps := v.SvcPorts.Get("default/lb")
		if len(ps) != 1 || ps[0].LoadBalancer != a || ps[0].NodePort == 0 {
			return a, fmt.Errorf("%s: ports %+v, want the address %v and a NodePort", n.name, ps, a)
		}
		return a, nil
	}
	same := func(pool netip.Prefix) netip.Addr {
		var got netip.Addr
		waitFor(t, 10*time.Second, func() error {
			for i, n := range nodes {
				a, err := addrOf(n)
				if err != nil {
					return err
				}
				if !pool.Contains(a) || i > 0 && a != got {
					return fmt.Errorf("%s: %v (others %v), want one address of %v", n.name, a, got, pool)
				}
				got = a
			}
			return nil
		})
		return got
	}
	addr := same(netip.MustParsePrefix("192.0.2.240/28"))
	links := map[string]*fakeLink{}
	anns := map[string]*announce.Announcer{}
	for _, n := range nodes {
		links[n.name] = &fakeLink{}
		anns[n.name] = announce.New(announce.Config{Self: n.name, Views: n.agent.views, Quorum: n.agent.work.fence, Link: links[n.name], Log: n.agent.log})
	}
	holders := func(live []*testNode) []string {
		var out []string
		for _, n := range live {
			anns[n.name].Pass(time.Now())
			if h, _ := links[n.name].Held(); slices.Contains(h, addr) {
				out = append(out, n.name)
			}
		}
		return out
	}
	var owner string
	waitFor(t, 10*time.Second, func() error {
		if h := holders(nodes); len(h) != 1 {
			return fmt.Errorf("holders of %v: %v, want one", addr, h)
		}
		owner = holders(nodes)[0]
		return nil
	})
	var rest []*testNode
	for _, n := range nodes {
		if n.name == owner {
			n.stop()
		} else {
			rest = append(rest, n)
		}
	}
	waitFor(t, 15*time.Second, func() error {
		if h := holders(rest); len(h) != 1 || h[0] == owner {
			return fmt.Errorf("%s stopped: holders %v, want one other", owner, h)
		}
		return nil
	})
	nodes = rest
	if code, body := applyYAML(t, nodes[0], "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lb-pool, namespace: starling-system}\ndata: {cidr: 198.51.100.0/30}\n"); code != 200 {
		t.Fatalf("new pool: %d %s", code, body)
	}
	if moved := same(netip.MustParsePrefix("198.51.100.0/30")); moved == addr {
		t.Fatalf("a new pool kept the address %v", addr)
	}
}
