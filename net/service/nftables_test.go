package service

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
)

// nftKernel is what the ip starling table holds: its chains, and the
// elements (key -> goto chain) of its maps.
type nftKernel struct {
	chains []string
	elems  map[string]map[string]string
	rules  map[string]string // per-port and pick chain -> ruleShape
}

// ruleShape sums up a chain's rules: how many, where the last one goes,
// and the modulus of a numgen in it ("2 rules, goto pick-5, mod 0").
func ruleShape(n int, target string, mod uint32) string {
	return fmt.Sprintf("%d rules, goto %s, mod %d", n, target, mod)
}

func readNFT(b *nftBackend) (nftKernel, error) {
	var k nftKernel
	chains, err := b.conn.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return k, err
	}
	for _, c := range chains {
		if c.Table.Name == NFTTable {
			k.chains = append(k.chains, c.Name)
		}
	}
	slices.Sort(k.chains)
	k.rules = map[string]string{}
	for _, name := range k.chains {
		if !isNFTPortChain(name) {
			continue
		}
		rules, err := b.conn.GetRules(b.table, &nftables.Chain{Table: b.table, Name: name})
		if err != nil {
			return k, fmt.Errorf("rules of %s: %w", name, err)
		}
		var target string
		var mod uint32
		for _, r := range rules {
			for _, e := range r.Exprs {
				switch e := e.(type) {
				case *expr.Verdict:
					if e.Kind == expr.VerdictGoto {
						target = e.Chain
					}
				case *expr.Numgen:
					mod = e.Modulus
				}
			}
		}
		k.rules[name] = ruleShape(len(rules), target, mod)
	}
	k.elems = map[string]map[string]string{}
	for name, set := range b.sets {
		els, err := b.conn.GetSetElements(set)
		if err != nil {
			return k, fmt.Errorf("elements of %s: %w", name, err)
		}
		m := map[string]string{}
		for _, e := range els {
			if nftVerdictMap(name) {
				m[string(e.Key)] = verdictChain(e.Val)
			} else {
				m[string(e.Key)] = string(e.Val)
			}
		}
		k.elems[name] = m
	}
	return k, nil
}

// wantNFT is what the table must hold for the ports of m.
func wantNFT(m *Model) nftKernel {
	k := nftKernel{elems: map[string]map[string]string{}, rules: map[string]string{}}
	shape := func(c nftChain) {
		var target string
		var mod uint32
		for _, r := range c.rules {
			if r.kind == gotoChain {
				target = r.chain
			}
			if r.kind == dnatMap || r.kind == dnatNodePortMap {
				mod = r.mod
			}
		}
		k.rules[c.name] = ruleShape(len(c.rules), target, mod)
	}
	for _, set := range nftSets {
		k.elems[set] = map[string]string{}
	}
	k.chains = []string{nftServices, nftMarkMasq, nftMasquerading, nftRejectChain, nftEndpointsCheck,
		"nat-prerouting", "nat-output", "nat-postrouting", "filter-input", "filter-forward", "filter-output"}
	for _, p := range m.Ports() {
		r := renderNFT(p, m.Config())
		for _, c := range r.chains {
			k.chains = append(k.chains, c.name)
			shape(c)
		}
		for _, e := range r.elems {
			k.elems[e.set][e.key] = e.val
		}
		for _, ep := range p.Endpoints {
			k.elems[nftHairpin][hairpinElem(ep.Addr()).key] = ""
		}
	}
	for name := range count(m.Ports(), picksUnder(m.Config())) {
		k.chains = append(k.chains, name)
		shape(pickFor(name))
	}
	slices.Sort(k.chains)
	return k
}

func (k nftKernel) diff(want nftKernel) error {
	if !slices.Equal(k.chains, want.chains) {
		return fmt.Errorf("chains: the table holds %d, the model %d (%v vs %v)", len(k.chains), len(want.chains), firstDiff(k.chains, want.chains), firstDiff(want.chains, k.chains))
	}
	for chain, w := range want.rules {
		if g := k.rules[chain]; g != w {
			return fmt.Errorf("chain %s: %s, want %s", chain, g, w)
		}
	}
	for set, w := range want.elems {
		g := k.elems[set]
		if len(g) != len(w) {
			return fmt.Errorf("map %s: %d elements, the model %d", set, len(g), len(w))
		}
		for key, chain := range w {
			if g[key] != chain {
				return fmt.Errorf("map %s: element %x holds %q, want %q", set, key, g[key], chain)
			}
		}
	}
	return nil
}

func firstDiff(a, b []string) string {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return x
		}
	}
	return "-"
}

// nftDump is `nft list table ip starling` when the nft tool is there
// (for failure messages only).
func nftDump() string {
	out, err := exec.Command("nft", "list", "table", "ip", NFTTable).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("(nft: %v)", err)
	}
	return string(out)
}

// In a real kernel, over netlink: the table holds exactly the chains and
// map elements of the model after every sync, across 1,000 cycles of
// creating and deleting a Service, endpoint changes, a Service losing
// and regaining its endpoints (every other cycle given as the changed
// Services alone, as the agent's services loop gives them), a deleted table (repaired on the next
// sync) and a restart (a new Syncer removes what the old one programmed
// and no port uses any more); then tables of 1,500 Services, larger than
// one netlink attribute and one transaction.
func TestNFTSyncerTableFollowsTheModel(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	inNewNetns(t, func() error {
		s, err := NewNFTSyncer(nil)
		if err != nil {
			return err
		}
		b := s.b.(*nftBackend)
		check := func(step string) error {
			k, err := readNFT(b)
			if err != nil {
				return fmt.Errorf("%s: %w", step, err)
			}
			if err := k.diff(wantNFT(&s.model)); err != nil {
				return fmt.Errorf("%s: %w\n%s", step, err, nftDump())
			}
			return nil
		}
		base := benchPorts(3)
		base[2].Endpoints = nil // a Service without endpoints
		for cycle := 0; cycle < 1000; cycle++ {
			extra := Port{Service: fmt.Sprintf("default/cycle%d", cycle), Name: "p", Protocol: UDP, ClusterIP: netip.MustParseAddr("10.23.1.1"), Port: 53,
				NodePort: 31000, Endpoints: addrPorts(fmt.Sprintf("10.22.3.%d:53", 2+cycle%200), "10.22.4.2:53")}
			changed := slices.Clone(base)
			changed[0].Endpoints = changed[0].Endpoints[:1+cycle%5]
			if cycle%7 == 0 {
				changed[1].Endpoints = nil
			}
			for _, ports := range [][]Port{append(changed, extra), base} {
				// Every other cycle as the agent's services loop syncs:
				// given the Services that changed.
				var err error
				if cycle%2 == 0 {
					_, err = s.Sync(context.Background(), ports, cfg)
				} else {
					svcs := byService(ports, []string{base[0].Service, base[1].Service, extra.Service})
					_, err = s.SyncServices(context.Background(), svcs, func() []Port { return ports }, cfg)
				}
				if err != nil {
					return fmt.Errorf("cycle %d: %w\n%s", cycle, err, nftDump())
				}
				if cycle%50 == 0 {
					if err := check(fmt.Sprintf("cycle %d", cycle)); err != nil {
						return err
					}
				}
			}
		}
		if err := check("after 1,000 cycles"); err != nil {
			return err
		}

		// Someone deletes the table: the next sync restores it.
		conn, _ := nftables.New()
		conn.DelTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: NFTTable})
		if err := conn.Flush(); err != nil {
			return err
		}
		if b.intact() {
			return fmt.Errorf("intact after the table was deleted")
		}
		if wrote, err := s.Sync(context.Background(), base, cfg); err != nil || !wrote {
			return fmt.Errorf("sync after the table was deleted: wrote %v, %v", wrote, err)
		}
		if err := check("after the table was deleted"); err != nil {
			return err
		}

		// A restart: the old run's Services that are gone go too.
		s2, err := NewNFTSyncer(nil)
		if err != nil {
			return err
		}
		if _, err := s2.Sync(context.Background(), base[:1], cfg); err != nil {
			return err
		}
		k, err := readNFT(s2.b.(*nftBackend))
		if err != nil {
			return err
		}
		if err := k.diff(wantNFT(&s2.model)); err != nil {
			return fmt.Errorf("after a restart: %w", err)
		}

		// Large tables: more elements than one netlink attribute holds
		// (they used to go missing), and changes and full syncs larger
		// than one transaction.
		big := benchPorts(1500)
		for _, step := range []struct {
			name  string
			ports func() []Port
			fresh bool
		}{
			{"1,500 Services added at once", func() []Port { return big }, false},
			{"every endpoint of 1,500 Services replaced", func() []Port {
				for i := range big {
					big[i].Endpoints = slices.Clone(big[i].Endpoints)
					big[i].Endpoints[0] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, 9, byte(i%250 + 2)}), 9090)
				}
				return big
			}, false},
			{"a restart with 700 of them", func() []Port { return big[:700] }, true},
			// Map keys that pass from one port to another in one
			// change: a renamed port (same ClusterIP, port, NodePort
			// and endpoints), and a Service removed while another
			// takes its ClusterIP and NodePort with other endpoints.
			// (The new port's elements were deleted as the old port's,
			// or refused as existing.)
			{"a port renamed", func() []Port {
				big = big[:700]
				big[0].Name = "renamed"
				return big
			}, false},
			{"a Service's ClusterIP and NodePort taken by another", func() []Port {
				taker := big[1]
				taker.Service, taker.Endpoints = "default/taker", addrPorts("10.22.7.2:80", "10.22.7.3:80", "10.22.7.4:80")
				big = append(big[:1], big[2:]...)
				return append(big, taker)
			}, false},
		} {
			if step.fresh {
				if s2, err = NewNFTSyncer(nil); err != nil {
					return err
				}
			}
			if _, err := s2.Sync(context.Background(), step.ports(), cfg); err != nil {
				return fmt.Errorf("%s: %w", step.name, err)
			}
			k, err := readNFT(s2.b.(*nftBackend))
			if err != nil {
				return err
			}
			if err := k.diff(wantNFT(&s2.model)); err != nil {
				return fmt.Errorf("%s: %w", step.name, err)
			}
		}
		return nil
	})
}

// Traffic through the table: a ClusterIP reaches its endpoints (spread
// over all of them), a NodePort on the node's address too, a Service
// without endpoints refuses at once, and a NodePort on 127.0.0.1 is
// refused, never hangs.
func TestNFTSyncerServesClusterIPsAndNodePorts(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	inNewNetns(t, func() error {
		if _, err := vethUp("pods", "pods1"); err != nil {
			return err
		}
		d, err := netlink.LinkByName("pods")
		if err != nil {
			return err
		}
		for _, a := range []string{"10.22.1.1/24", "10.22.1.2/32", "10.22.1.3/32"} {
			addr, _ := netlink.ParseAddr(a)
			if err := netlink.AddrAdd(d, addr); err != nil {
				return err
			}
		}
		_, svcNet, _ := net.ParseCIDR("10.23.0.0/16")
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: d.Attrs().Index, Dst: svcNet}); err != nil {
			return err
		}
		// Three "pods": listeners that answer with their address.
		var eps []netip.AddrPort
		for _, a := range []string{"10.22.1.1", "10.22.1.2", "10.22.1.3"} {
			l, err := net.Listen("tcp", a+":8080")
			if err != nil {
				return err
			}
			defer l.Close()
			eps = append(eps, netip.MustParseAddrPort(a+":8080"))
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					io.WriteString(c, a)
					c.Close()
				}
			}()
		}
		ports := []Port{
			{Service: "default/web", Name: "http", Protocol: TCP, ClusterIP: netip.MustParseAddr("10.23.0.10"), Port: 80, NodePort: 30080, Endpoints: eps},
			{Service: "default/empty", Name: "http", Protocol: TCP, ClusterIP: netip.MustParseAddr("10.23.0.11"), Port: 80, NodePort: 30081},
		}
		s, err := NewNFTSyncer(nil)
		if err != nil {
			return err
		}
		if _, err := s.Sync(context.Background(), ports, cfg); err != nil {
			return fmt.Errorf("%w\n%s", err, nftDump())
		}
		get := func(addr string) (string, error) {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				return "", err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			b, err := io.ReadAll(c)
			return string(b), err
		}
		for _, target := range []string{"10.23.0.10:80", "10.22.1.1:30080"} {
			seen := map[string]int{}
			for range 60 {
				got, err := get(target)
				if err != nil {
					return fmt.Errorf("%s: %w\n%s", target, err, nftDump())
				}
				seen[got]++
			}
			if len(seen) != 3 {
				return fmt.Errorf("%s reached %v, want all 3 endpoints", target, seen)
			}
		}
		for _, target := range []string{"10.23.0.11:80", "10.22.1.1:30081", "127.0.0.1:30080"} {
			start := time.Now()
			_, err := get(target)
			if err == nil || !strings.Contains(err.Error(), "refused") && !isRefused(err) {
				return fmt.Errorf("%s: %v, want connection refused", target, err)
			}
			if took := time.Since(start); took > time.Second {
				return fmt.Errorf("%s: refused after %v", target, took)
			}
		}
		// The dry run's text of the table is valid nft input that says
		// the same (nft checks it without applying, where installed).
		if _, err := exec.LookPath("nft"); err == nil {
			cmd := exec.Command("nft", "-c", "-f", "-")
			cmd.Stdin = strings.NewReader("delete table ip starling\n" + string(NFTText(ports, cfg)))
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("nft -c -f refuses NFTText: %v: %s\n%s", err, out, NFTText(ports, cfg))
			}
		}
		// One endpoint goes: it is never chosen again.
		ports[0].Endpoints = eps[:2]
		if _, err := s.Sync(context.Background(), ports, cfg); err != nil {
			return err
		}
		for range 30 {
			got, err := get("10.23.0.10:80")
			if err != nil {
				return err
			}
			if got == "10.22.1.3" {
				return fmt.Errorf("a removed endpoint answered")
			}
		}
		return nil
	})
}

func isRefused(err error) bool {
	var se syscall.Errno
	for e := err; e != nil; {
		if x, ok := e.(syscall.Errno); ok {
			se = x
			break
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return se == syscall.ECONNREFUSED || se == syscall.EHOSTUNREACH
}

// Each of n endpoints is chosen with probability 1/n: the port's chain
// draws an index below n, and indices 0..n-1 each map to one endpoint.
func TestNFTRulesSpreadEvenlyOverEndpoints(t *testing.T) {
	for n := 1; n <= 7; n++ {
		var eps []netip.AddrPort
		for i := range n {
			eps = append(eps, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, 1, byte(i + 2)}), 80))
		}
		p := canonical(Port{Service: "default/s", Protocol: TCP, ClusterIP: netip.MustParseAddr("10.23.0.1"), Port: 80, Endpoints: eps})
		r := renderNFT(p, Config{})
		svc := r.chains[0]
		last := svc.rules[len(svc.rules)-1]
		if last.kind != gotoChain || len(pickFor(last.chain).rules) != 1 {
			t.Fatalf("n=%d: the chain ends with %v, want a goto to a pick chain", n, last)
		}
		if pick := pickFor(last.chain).rules[0]; pick.kind != dnatMap || pick.mod != uint32(n) {
			t.Fatalf("n=%d: %s holds %v, want a draw below %d", n, last.chain, pick, n)
		}
		got := map[string]string{}
		for _, e := range r.elems {
			if e.set == nftServiceEndpoints {
				got[e.key] = e.val
			}
		}
		for i, ep := range p.Endpoints {
			if v := got[endpointKey(p.ClusterIP, TCP, 80, i)]; v != endpointVal(ep) {
				t.Errorf("n=%d: index %d maps to %x, want %v", n, i, v, ep)
			}
		}
		if len(got) != n {
			t.Errorf("n=%d: %d endpoint elements", n, len(got))
		}
	}
}

// An agent upgraded from the layout with a chain per endpoint (the table
// an earlier version wrote for one port, testdata/nft-endpoint-chains.nft)
// converges on its first sync: the endpoint chains go, the maps and pick
// chains come, and nothing else is left.
func TestNFTSyncerUpgradesTheEndpointChainLayout(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft tool to write the old table")
	}
	cfg := Config{ClusterCIDR: clusterCIDR}
	inNewNetns(t, func() error {
		if out, err := exec.Command("nft", "-f", "testdata/nft-endpoint-chains.nft").CombinedOutput(); err != nil {
			return fmt.Errorf("nft -f: %v: %s", err, out)
		}
		before, _ := exec.Command("nft", "list", "table", "ip", NFTTable).CombinedOutput()
		if !strings.Contains(string(before), "endpoint-C4YJSLPGAG4J") {
			return fmt.Errorf("the old table lacks its endpoint chain:\n%s", before)
		}
		ports := []Port{{Service: "default/web", Name: "http", Protocol: TCP, ClusterIP: netip.MustParseAddr("10.23.0.10"), Port: 80, NodePort: 30080,
			Endpoints: addrPorts("10.22.1.1:8080", "10.22.1.2:8080")}}
		s, err := NewNFTSyncer(nil)
		if err != nil {
			return err
		}
		if _, err := s.Sync(context.Background(), ports, cfg); err != nil {
			return fmt.Errorf("first sync over the old table: %w\n%s", err, nftDump())
		}
		k, err := readNFT(s.b.(*nftBackend))
		if err != nil {
			return err
		}
		if err := k.diff(wantNFT(&s.model)); err != nil {
			return fmt.Errorf("after the first sync: %w\n%s", err, nftDump())
		}
		return nil
	})
}
