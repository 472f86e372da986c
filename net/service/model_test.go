package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// kernel is iptables-restore --noflush applied to tables held in memory,
// strictly: a declared chain is created or flushed, -D of a missing rule,
// -X of a chain that does not exist, is not empty or is still jumped to,
// and a jump to a missing chain all fail the transaction, which then
// changes nothing (as the kernel's commit does).
type kernel map[string]map[string][]string // table -> chain -> rules

func (k kernel) clone() kernel {
	out := kernel{}
	for t, chains := range k {
		out[t] = map[string][]string{}
		for c, r := range chains {
			out[t][c] = slices.Clone(r)
		}
	}
	return out
}

func (k kernel) apply(text []byte) error {
	if len(text) == 0 {
		return nil
	}
	next := k.clone()
	table := ""
	for i, line := range strings.Split(strings.TrimSuffix(string(text), "\n"), "\n") {
		fail := func(format string, args ...any) error {
			return fmt.Errorf("line %d %q: %s", i+1, line, fmt.Sprintf(format, args...))
		}
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			if next[table] == nil {
				next[table] = map[string][]string{}
			}
		case line == "COMMIT":
			for c, rules := range next[table] {
				for _, r := range rules {
					if f := strings.Fields(r); len(f) > 1 && f[len(f)-2] == "-j" && strings.HasPrefix(f[len(f)-1], "STARLING-") {
						if _, ok := next[table][f[len(f)-1]]; !ok {
							return fail("chain %s jumps to missing %s", c, f[len(f)-1])
						}
					}
				}
			}
			table = ""
		case strings.HasPrefix(line, ":"):
			next[table][strings.Fields(line[1:])[0]] = nil
		default:
			f := strings.SplitN(line, " ", 3)
			if len(f) < 2 {
				return fail("bad line")
			}
			chain := f[1]
			rules, ok := next[table][chain]
			if !ok {
				return fail("no chain %s", chain)
			}
			spec := ""
			if len(f) == 3 {
				spec = f[2]
			}
			switch f[0] {
			case "-A":
				next[table][chain] = append(rules, spec)
			case "-I":
				pos, rest, _ := strings.Cut(spec, " ")
				if pos != "1" {
					return fail("insert at %s", pos)
				}
				next[table][chain] = append([]string{rest}, rules...)
			case "-D":
				i := slices.Index(rules, spec)
				if i < 0 {
					return fail("no such rule")
				}
				next[table][chain] = slices.Delete(rules, i, i+1)
			case "-X":
				if len(rules) > 0 {
					return fail("chain not empty")
				}
				for c, rs := range next[table] {
					for _, r := range rs {
						if strings.HasSuffix(r, "-j "+chain) {
							return fail("chain referenced by %s", c)
						}
					}
				}
				delete(next[table], chain)
			default:
				return fail("unknown operation")
			}
		}
	}
	for t := range k {
		delete(k, t)
	}
	for t, c := range next {
		k[t] = c
	}
	return nil
}

// sameRules compares the rules of chain. The dispatch, NodePort and
// reject chains hold one rule per port, which match disjoint packets:
// their order does not matter, but the dispatch chain's last rule (to the
// NodePorts) must stay last.
func sameRules(chain string, got, want []string) bool {
	switch chain {
	case ChainServices:
		if len(got) == 0 || len(want) == 0 || got[len(got)-1] != want[len(want)-1] {
			return false
		}
		fallthrough
	case ChainNodePorts, ChainFilter:
		got, want = slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
	}
	return slices.Equal(got, want)
}

// portChains counts the per-port chains k holds.
func (k kernel) portChains() int {
	n := 0
	for c := range k["nat"] {
		if isServiceChain(c) {
			n++
		}
	}
	return n
}

// fullKernel is what a full sync of ports writes on empty tables.
func fullKernel(t *testing.T, ports []Port, cfg Config) kernel {
	var m Model
	m.Update(ports, cfg)
	k := kernel{}
	for _, text := range fullText(m.Ports(), cfg, nil, 50) {
		if err := k.apply(text); err != nil {
			t.Fatalf("full text does not apply: %v\n%s", err, text)
		}
	}
	return k
}

func randomPorts(rng *rand.Rand, services int) []Port {
	var ports []Port
	for i := 0; i < services; i++ {
		if rng.Intn(3) == 0 {
			continue
		}
		p := Port{Service: fmt.Sprintf("ns/s%d", i), Name: "p", Protocol: []Protocol{TCP, UDP}[rng.Intn(2)],
			ClusterIP: netip.AddrFrom4([4]byte{10, 23, 0, byte(1 + i)}), Port: uint16(80 + rng.Intn(2))}
		if rng.Intn(2) == 0 {
			p.NodePort = uint16(30000 + i*2 + rng.Intn(2))
		}
		for e := rng.Intn(4); e > 0; e-- {
			p.Endpoints = append(p.Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, byte(rng.Intn(3)), byte(2 + rng.Intn(4))}), 8080))
		}
		ports = append(ports, p)
	}
	rng.Shuffle(len(ports), func(i, j int) { ports[i], ports[j] = ports[j], ports[i] })
	return ports
}

// Applying each Change on top of the last gives exactly the tables a full
// sync of the same ports gives: no rule is left behind or missing, no
// chain of a removed port or endpoint stays, and every text applies
// (iptables-restore would refuse a -D of a missing rule or an -X of a
// used chain).
func TestChangesApplyToWhatAFullSyncWrites(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	cfg := Config{ClusterCIDR: clusterCIDR}
	for run := 0; run < 30; run++ {
		var m Model
		m.Update(nil, cfg)
		k := fullKernel(t, nil, cfg)
		for step := 0; step < 40; step++ {
			ports := randomPorts(rng, 8)
			c := m.Update(ports, cfg)
			text := ChangeText(c, cfg)
			if c.Empty() != (len(text) == 0) {
				t.Fatalf("run %d step %d: empty change %v, text %q", run, step, c.Empty(), text)
			}
			if err := k.apply(text); err != nil {
				t.Fatalf("run %d step %d: change does not apply: %v\n%s", run, step, err, text)
			}
			want := fullKernel(t, ports, cfg)
			for _, table := range []string{"nat", "filter"} {
				for c, rules := range want[table] {
					if !sameRules(c, k[table][c], rules) {
						t.Fatalf("run %d step %d: %s %s holds\n%q\nwant\n%q\nafter\n%s", run, step, table, c, k[table][c], rules, text)
					}
				}
				if len(k[table]) != len(want[table]) {
					t.Fatalf("run %d step %d: %s has %d chains, a full sync %d", run, step, table, len(k[table]), len(want[table]))
				}
			}
		}
	}
}

// A change of one endpoint among 1,000 Services renders only that
// Service's chains and nothing of the others.
func TestChangeTextFollowsTheChange(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	ports := benchPorts(1000)
	var m Model
	m.Update(ports, cfg)
	ports[500].Endpoints = slices.Clone(ports[500].Endpoints)
	ports[500].Endpoints[2] = netip.MustParseAddrPort("10.22.9.9:8080")
	c := m.Update(ports, cfg)
	if len(c.Updated) != 1 || len(c.Added)+len(c.Removed) != 0 {
		t.Fatalf("change = %+v, want one update", c)
	}
	text := string(ChangeText(c, cfg))
	// The SVC chain (new probabilities), the new endpoint's chain, and the
	// old endpoint's chain flushed and deleted; nothing in the dispatch
	// chain, whose rule did not change.
	if got := declaredChains([]byte(text)); len(got) != 3 {
		t.Errorf("declared %v, want the SVC chain, a new SEP chain and the old one", got)
	}
	if strings.Contains(text, ChainServices) || strings.Count(text, "\n-A ") > 8 {
		t.Errorf("the change rendered more than its Service:\n%s", text)
	}
	for _, p := range []int{0, 499, 501, 999} {
		if strings.Contains(text, commentText(ports[p].key().String())) || strings.Contains(text, chainName(svcPrefix, ports[p].key().String())) {
			t.Errorf("port %d appears in the change:\n%s", p, text)
		}
	}
	// Nothing changed: nothing to render.
	if c := m.Update(ports, cfg); !c.Empty() {
		t.Errorf("same ports again: %+v", c)
	}
	// The same endpoints in another order are the same port.
	slices.Reverse(ports[7].Endpoints)
	if c := m.Update(ports, cfg); !c.Empty() {
		t.Errorf("reordered endpoints: %+v", c)
	}
}

// After 1,000 cycles of creating and deleting Services and endpoints, the
// tables hold exactly the chains the model does: none of a deleted port
// or endpoint is left, none is re-created.
func TestChainsStayEqualToTheModelOverCreateDeleteCycles(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	rng := rand.New(rand.NewSource(2))
	var m Model
	m.Update(nil, cfg)
	k := fullKernel(t, nil, cfg)
	base := benchPorts(20)
	for cycle := 0; cycle < 1000; cycle++ {
		ports := slices.Clone(base)
		extra := benchPorts(20 + rng.Intn(5))[20:]
		for i := range extra {
			extra[i].Service = fmt.Sprintf("default/cycle%d-%d", cycle, i)
		}
		for _, step := range [][]Port{append(ports, extra...), ports} {
			c := m.Update(step, cfg)
			if err := k.apply(ChangeText(c, cfg)); err != nil {
				t.Fatalf("cycle %d: %v", cycle, err)
			}
			if got, want := k.portChains(), modelChains(&m); got != want {
				t.Fatalf("cycle %d: %d per-port chains programmed, the model holds %d", cycle, got, want)
			}
		}
	}
}

// modelChains counts the per-port chains the model's ports render to.
func modelChains(m *Model) int {
	n := 0
	for _, p := range m.Ports() {
		n += len(renderPort(p, m.Config()).chains)
	}
	return n
}

// A full sync deletes per-port chains the kernel holds and no port uses
// (left by an earlier run), and never a chain not named like Starling's.
func TestFullSyncDeletesStaleChainsFromTheKernel(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	old := []Port{webPort("10.22.1.2:8080"), {Service: "default/gone", Name: "p", Protocol: UDP, ClusterIP: netip.MustParseAddr("10.23.0.30"), Port: 53, NodePort: 30053, Endpoints: addrPorts("10.22.1.7:53")}}
	k := fullKernel(t, old, cfg)
	k["nat"]["KUBE-SVC-OTHER"] = []string{"-j RETURN"}
	var kernelChains []string
	for c := range k["nat"] {
		kernelChains = append(kernelChains, c)
	}
	now := []Port{webPort("10.22.1.3:8080")}
	var m Model
	m.Update(now, cfg)
	for _, text := range fullText(m.Ports(), cfg, kernelChains, 50) {
		if err := k.apply(text); err != nil {
			t.Fatalf("%v\n%s", err, text)
		}
	}
	want := fullKernel(t, now, cfg)
	if got := k.portChains(); got != want.portChains() {
		t.Errorf("%d per-port chains after the full sync, want %d: %v", got, want.portChains(), k["nat"])
	}
	if _, ok := k["nat"]["KUBE-SVC-OTHER"]; !ok {
		t.Error("a chain that is not Starling's was deleted")
	}
}

func benchPorts(n int) []Port {
	ports := make([]Port, n)
	for i := range ports {
		ports[i] = Port{Service: fmt.Sprintf("default/s%d", i), Name: "http", Protocol: TCP,
			ClusterIP: netip.AddrFrom4([4]byte{10, 23, byte(i / 250), byte(i%250 + 1)}), Port: 80, NodePort: uint16(30000 + i%2000)}
		for e := 0; e < 5; e++ {
			ports[i].Endpoints = append(ports[i].Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, byte(e), byte(i%250 + 2)}), 8080))
		}
	}
	return ports
}

// BenchmarkChange measures generating one endpoint change among n
// Services x 5 endpoints, as the agent does: Model.UpdateServices given
// the one changed Service, then rendering the change for each backend
// (iptables text, nftables chains and elements). Its time and
// allocations per change should not grow with n.
func BenchmarkChange(b *testing.B) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	for _, backend := range []string{"iptables", "nftables"} {
		for _, n := range []int{100, 1000, 10000} {
			b.Run(fmt.Sprintf("%s/%dx5", backend, n), func(b *testing.B) {
				ports := benchPorts(n)
				var m Model
				m.Update(ports, cfg)
				m.UpdateServices(nil, cfg)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					p := ports[n/2]
					p.Endpoints = []netip.AddrPort{p.Endpoints[0], netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, 9, byte(i)}), 8080)}
					c := m.UpdateServices(map[string][]Port{p.Service: {p}}, cfg)
					if backend == "nftables" {
						NFTChange(c, cfg)
					} else {
						ChangeText(c, cfg)
					}
				}
			})
		}
	}
}

// fakeTables is the kernel of a Syncer in memory; fail makes the next
// restore fail after applying nothing.
type fakeTables struct {
	k        kernel
	fail     bool
	restores []string
}

func (f *fakeTables) restore(_ context.Context, text []byte) error {
	f.restores = append(f.restores, string(text))
	if f.fail {
		f.fail = false
		return errors.New("restore failed")
	}
	return f.k.apply(text)
}

func (f *fakeTables) natChains() ([]string, error) { return slices.Collect(maps.Keys(f.k["nat"])), nil }
func (f *fakeTables) ensureJumps() error {
	for table, chains := range map[string][]string{"nat": {ChainServices, ChainPostrouting}, "filter": {ChainFilter, ChainForward}} {
		if f.k[table] == nil {
			f.k[table] = map[string][]string{}
		}
		for _, c := range chains {
			if _, ok := f.k[table][c]; !ok {
				f.k[table][c] = nil
			}
		}
	}
	return nil
}
func (f *fakeTables) canary() bool {
	return slices.Equal(f.k["nat"][ChainCanary], []string{"-j RETURN"}) && slices.Equal(f.k["filter"][ChainCanary], []string{"-j RETURN"})
}
func (f *fakeTables) forgetUDP(func(*netlink.ConntrackFlow) bool) {}

// holdsAFullSyncOf fails t unless f holds what a full sync of ports
// under cfg writes: the same rules in every chain, and as many per-port
// chains.
func (f *fakeTables) holdsAFullSyncOf(t *testing.T, step string, ports []Port, cfg Config) {
	t.Helper()
	want := fullKernel(t, ports, cfg)
	for table, chains := range want {
		for c, rules := range chains {
			if !sameRules(c, f.k[table][c], rules) {
				t.Fatalf("%s: %s %s = %q, want %q", step, table, c, f.k[table][c], rules)
			}
		}
	}
	if got, want := f.k.portChains(), want.portChains(); got != want {
		t.Fatalf("%s: %d per-port chains, want %d", step, got, want)
	}
}

// The Syncer writes a change alone while the kernel holds what it
// programmed, and everything (deleting what no port uses) after a failed
// restore, a flushed table or a new configuration.
func TestSyncerWritesChangesAndRepairsAfterFailureOrFlush(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	f := &fakeTables{k: kernel{}}
	s := &Syncer{b: xt{t: f}}
	ports := benchPorts(50)
	check := func(step string, wantFull bool) {
		t.Helper()
		if _, err := s.Sync(context.Background(), ports, cfg); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		last := f.restores[len(f.restores)-1]
		if full := strings.Contains(last, ":"+ChainCanary); full != wantFull {
			t.Fatalf("%s: full rewrite %v, want %v:\n%s", step, full, wantFull, last)
		}
		f.holdsAFullSyncOf(t, step, ports, s.model.Config())
	}
	check("first sync", true)
	ports[3].Endpoints = ports[3].Endpoints[:2]
	check("one endpoint fewer", false)
	n := len(f.restores)
	if wrote, _ := s.Sync(context.Background(), ports, cfg); wrote || len(f.restores) != n {
		t.Fatal("a sync with nothing changed wrote")
	}
	ports = ports[1:]
	f.fail = true
	if _, err := s.Sync(context.Background(), ports, cfg); err == nil {
		t.Fatal("the failed restore was not reported")
	}
	ports = ports[1:]
	check("after a failed restore", true)
	f.k["nat"][ChainCanary] = nil // iptables -t nat -F
	check("after a flush", true)
	cfg.MasqueradeAll = true
	check("new configuration", true)
}

// byService groups ports by Service key, with an entry (maybe empty) for
// each of keys.
func byService(ports []Port, keys []string) map[string][]Port {
	out := map[string][]Port{}
	for _, k := range keys {
		out[k] = nil
	}
	for _, p := range ports {
		if _, ok := out[p.Service]; ok {
			out[p.Service] = append(out[p.Service], p)
		}
	}
	return out
}

// A model fed Service by Service (UpdateServices, given only the Services
// that changed) holds what a model fed every port each time (Update)
// holds, and reports the same changes; Services it is not given keep
// their ports. Mixed with full Updates, both stay equal.
func TestUpdateServicesFollowsUpdate(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	cfg := Config{ClusterCIDR: clusterCIDR}
	for run := 0; run < 50; run++ {
		var full, inc Model
		var ports []Port
		for step := 0; step < 40; step++ {
			next := randomPorts(rng, 8)
			// Some Services keep their ports exactly.
			for _, p := range ports {
				if rng.Intn(2) == 0 {
					next = slices.DeleteFunc(next, func(q Port) bool { return q.Service == p.Service })
				}
			}
			kept := map[string]bool{}
			for _, p := range ports {
				if _, seen := kept[p.Service]; !seen && !slices.ContainsFunc(next, func(q Port) bool { return q.Service == p.Service }) {
					kept[p.Service] = rng.Intn(2) == 0
				}
				if kept[p.Service] {
					next = append(next, p) // every port of a kept Service
				}
			}
			// Changed: every Service of the old or new list not kept,
			// with a second port of another protocol now and then.
			var changed []string
			for _, p := range append(slices.Clone(ports), next...) {
				if !kept[p.Service] && !slices.Contains(changed, p.Service) {
					changed = append(changed, p.Service)
				}
			}
			if len(next) > 0 && rng.Intn(4) == 0 {
				q := next[0]
				q.Name, q.NodePort = "q", 0
				next = append(next, q)
				if !slices.Contains(changed, q.Service) {
					changed = append(changed, q.Service)
				}
			}
			want := full.Update(next, cfg)
			var got Change
			if rng.Intn(5) == 0 {
				got = inc.Update(next, cfg)
			} else {
				got = inc.UpdateServices(byService(next, changed), cfg)
			}
			if !reflectEqualChanges(got, want) {
				t.Fatalf("run %d step %d: UpdateServices(%v) = %+v\nUpdate = %+v", run, step, changed, got, want)
			}
			if !slices.EqualFunc(inc.Ports(), full.Ports(), func(a, b Port) bool { return comparePorts(a, b) == 0 && samePort(a, b) }) {
				t.Fatalf("run %d step %d: the models differ:\n%+v\n%+v", run, step, inc.Ports(), full.Ports())
			}
			ports = next
		}
	}
}

func reflectEqualChanges(a, b Change) bool {
	same := func(x, y Port) bool { return comparePorts(x, y) == 0 && samePort(x, y) }
	return a.Config == b.Config && slices.EqualFunc(a.Added, b.Added, same) && slices.EqualFunc(a.Removed, b.Removed, same) &&
		slices.EqualFunc(a.Updated, b.Updated, func(x, y Replaced) bool { return same(x.Old, y.Old) && same(x.New, y.New) })
}

// Finding a one-Service change with UpdateServices costs the same at 100
// and at 10,000 Services (allocations counted, not time: the model looks
// at the Service given only).
func TestUpdateServicesCostFollowsTheChange(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	allocs := map[int]float64{}
	for _, n := range []int{100, 10000} {
		ports := benchPorts(n)
		var m Model
		m.Update(ports, cfg)
		m.UpdateServices(nil, cfg) // index by Service once
		i := 0
		allocs[n] = testing.AllocsPerRun(50, func() {
			i++
			p := ports[n/2]
			p.Endpoints = slices.Clone(p.Endpoints)
			p.Endpoints[0] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 22, 9, byte(i)}), 8080)
			if c := m.UpdateServices(map[string][]Port{p.Service: {p}}, cfg); len(c.Updated) != 1 {
				t.Fatalf("change %+v, want one port updated", c)
			}
		})
	}
	if allocs[10000] > allocs[100] {
		t.Errorf("allocations per one-Service change: %v at 100 Services, %v at 10,000", allocs[100], allocs[10000])
	}
}

// SyncServices writes the given Services' change alone, asking for every
// port only when a full sync is due (first sync, after a failed restore,
// after a flush), and leaves the kernel as a full sync of every port
// would.
func TestSyncServicesAsksForEveryPortOnlyForAFullSync(t *testing.T) {
	cfg := Config{ClusterCIDR: clusterCIDR}
	f := &fakeTables{k: kernel{}}
	s := &Syncer{b: xt{t: f}}
	ports := benchPorts(50)
	asked := 0
	all := func() []Port { asked++; return ports }
	step := func(name string, changed map[string][]Port, wantAsked int) {
		t.Helper()
		if _, err := s.SyncServices(context.Background(), changed, all, cfg); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if asked != wantAsked {
			t.Fatalf("%s: every port asked for %d times, want %d", name, asked, wantAsked)
		}
		f.holdsAFullSyncOf(t, name, ports, cfg)
	}
	step("first sync", nil, 1)
	ports[3].Endpoints = ports[3].Endpoints[:2]
	step("one endpoint fewer", map[string][]Port{ports[3].Service: {ports[3]}}, 1)
	gone := ports[7].Service
	ports = slices.Delete(ports, 7, 8)
	step("a Service gone", map[string][]Port{gone: nil}, 1)
	f.fail = true
	ports = ports[1:]
	if _, err := s.SyncServices(context.Background(), map[string][]Port{benchPorts(50)[0].Service: nil}, all, cfg); err == nil {
		t.Fatal("the failed restore was not reported")
	}
	step("after a failed restore", nil, 2)
	f.k["nat"][ChainCanary] = nil // iptables -t nat -F
	step("after a flush", nil, 3)
}
