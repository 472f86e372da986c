package service

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/coreos/go-iptables/iptables"
	"github.com/starling-orchestrator/starling/net/xtables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// jumps are the rules from the built-in chains into Starling's, the only
// rules Starling keeps outside its own chains.
var jumps = []struct {
	table, chain, target, comment string
}{
	{"nat", "PREROUTING", ChainServices, "starling: service portals"},
	{"nat", "OUTPUT", ChainServices, "starling: service portals"},
	{"nat", "POSTROUTING", ChainPostrouting, "starling: service masquerade"},
	{"filter", "INPUT", ChainFilter, "starling: services without endpoints"},
	{"filter", "FORWARD", ChainFilter, "starling: services without endpoints"},
	{"filter", "OUTPUT", ChainFilter, "starling: services without endpoints"},
	{"filter", "FORWARD", ChainForward, "starling: forward service traffic"},
}

// Syncer programs the model into the kernel of the current network
// namespace through a backend (iptables or nftables). It is not safe for
// concurrent use.
type Syncer struct {
	b       backend
	model   Model              // what the kernel holds, as far as the last syncs went
	synced  bool               // the kernel holds model: false at start and after a failure
	started bool               // the first sync ran (it also cleans up after an earlier run)
	udp     map[netip.Addr]int // UDP endpoint addresses: how many ports use each
}

// backend writes the model into the kernel: a Change on top of what the
// kernel holds, or everything.
type backend interface {
	// change applies c (not a Config change) on top of the rules of the
	// model before c, as one transaction.
	change(ctx context.Context, c Change, cfg Config) error
	// full makes the kernel hold exactly the rules of ports under cfg,
	// removing whatever else of Starling's it finds (an earlier run's
	// Services, a half-written sync).
	full(ctx context.Context, ports []Port, cfg Config) error
	// intact is the cheap check run before every sync: false means
	// someone flushed or deleted Starling's rules.
	intact() bool
	// forgetUDP deletes the UDP conntrack entries that match.
	forgetUDP(match func(*netlink.ConntrackFlow) bool)
	// name is the backend's name for logs ("iptables-nft", "nftables").
	name() string
}

// Backend names the backend the Syncer writes with ("iptables-nft",
// "iptables-legacy", "iptables", "nftables").
func (s *Syncer) Backend() string { return s.b.name() }

// xt is the iptables backend, through iptables-restore (tables).
type xt struct {
	t    tables
	mode string
}

func (x xt) name() string { return x.mode }

func (x xt) change(ctx context.Context, c Change, cfg Config) error {
	return x.t.restore(ctx, ChangeText(c, cfg))
}

func (x xt) full(ctx context.Context, ports []Port, cfg Config) error {
	if err := x.t.ensureJumps(); err != nil {
		return err
	}
	kernel, err := x.t.natChains()
	if err != nil {
		return fmt.Errorf("list the nat table's chains: %w", err)
	}
	for _, text := range fullText(ports, cfg, kernel, batchLines) {
		if err := x.t.restore(ctx, text); err != nil {
			return err
		}
	}
	return nil
}

func (x xt) intact() bool { return x.t.canary() }

func (x xt) forgetUDP(match func(*netlink.ConntrackFlow) bool) { x.t.forgetUDP(match) }

// tables is the kernel as the iptables backend uses it (iptables, or a
// test's tables in memory).
type tables interface {
	// restore applies one iptables-restore --noflush input, atomically.
	restore(ctx context.Context, text []byte) error
	// natChains lists the nat table's chains.
	natChains() ([]string, error)
	// ensureJumps creates Starling's entry chains and the rules of the
	// built-in chains that jump to them.
	ensureJumps() error
	// canary reports whether the canary rules are in place (iptablesTables.canary).
	canary() bool
	// forgetUDP deletes the UDP conntrack entries that match.
	forgetUDP(match func(*netlink.ConntrackFlow) bool)
}

// NewSyncer uses the iptables backend b (xtables.Detect: the one the
// host's firewall is on). Errors name the package to install.
func NewSyncer(b xtables.Backend) (*Syncer, error) {
	ipt, err := iptables.New(iptables.Path(b.Iptables), iptables.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("%s: %w (install the Debian package iptables)", b.Iptables, err)
	}
	if _, err := exec.LookPath(b.Restore); err != nil {
		return nil, fmt.Errorf("%s: %w (install the Debian package iptables)", b.Restore, err)
	}
	return &Syncer{b: xt{t: iptablesTables{ipt, b.Restore}, mode: b.String()}}, nil
}

// iptablesTables is the kernel through the iptables commands of one
// backend.
type iptablesTables struct {
	ipt        *iptables.IPTables
	restoreCmd string // the backend's iptables-restore
}

func (t iptablesTables) restore(ctx context.Context, text []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, t.restoreCmd, "--noflush", "-w", "5")
	cmd.Stdin = bytes.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", t.restoreCmd, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (t iptablesTables) natChains() ([]string, error) { return t.ipt.ListChains("nat") }

// Sync makes the kernel hold the rules of ports under cfg and reports
// whether it wrote anything. It writes only what changed since the last
// sync (one iptables-restore call), unless this is the first sync, the
// last one failed, cfg changed or the canary shows that someone flushed
// the tables: then it rewrites every Starling chain and deletes the
// per-port chains no port uses, read from the kernel (what an earlier run
// left behind, or a failed sync half-wrote).
func (s *Syncer) Sync(ctx context.Context, ports []Port, cfg Config) (bool, error) {
	return s.sync(ctx, func(bool) Change { return s.model.Update(ports, cfg) })
}

// SyncServices is Sync for a change of some Services: changed holds, by
// Service key ("namespace/name"), each changed Service's ports (none: it
// has no port now, or is gone); every other Service keeps what the last
// sync gave it. Finding what to write costs in proportion to changed
// (Model.UpdateServices), not to the table. all returns every port; it
// is called only when a full sync is due (the first one, after a failed
// one, when the canary shows a flush).
func (s *Syncer) SyncServices(ctx context.Context, changed map[string][]Port, all func() []Port, cfg Config) (bool, error) {
	return s.sync(ctx, func(full bool) Change {
		if full {
			return s.model.Update(all(), cfg)
		}
		return s.model.UpdateServices(changed, cfg)
	})
}

// sync applies the change update makes to the model: on top of what the
// kernel holds, or everything when full (update is then given a new,
// empty model to fill).
func (s *Syncer) sync(ctx context.Context, update func(full bool) Change) (bool, error) {
	if s.synced && !s.b.intact() {
		s.synced = false
	}
	if !s.synced {
		s.model = Model{}
	}
	c := update(!s.synced)
	if s.synced && c.Empty() {
		return false, nil
	}
	err := s.write(ctx, c)
	if err != nil {
		s.synced = false
		return false, err
	}
	s.synced = true
	// The UDP endpoint addresses no port uses any more: counted again
	// after a full sync, followed through the change otherwise.
	var gone []netip.Addr
	if !s.started || c.Config || s.udp == nil || len(c.Added) == s.model.Len() {
		was := s.udp
		s.udp = count(s.model.Ports(), udpEndpointAddrs)
		for ip := range was {
			if s.udp[ip] == 0 {
				gone = append(gone, ip)
			}
		}
	} else {
		_, gone = recount(s.udp, c, udpEndpointAddrs)
	}
	s.forgetUDP(gone, s.model.Config())
	s.started = true
	return true, nil
}

// write applies c: as a change on top of what the kernel holds, or
// everything.
func (s *Syncer) write(ctx context.Context, c Change) error {
	if s.synced && !c.Config {
		return s.b.change(ctx, c, s.model.Config())
	}
	return s.b.full(ctx, s.model.Ports(), s.model.Config())
}

// batchLines bounds the rule lines of one iptables-restore call in a full
// sync: the nft backend's time grows faster than linearly with the size of
// one transaction (a single 170,000-line restore took over 5 min here).
const batchLines = 20000

// count counts, per key, the ports of ports that have it (keys(p) lists
// p's keys; a key listed twice counts twice).
func count[K comparable](ports []Port, keys func(Port) []K) map[K]int {
	out := map[K]int{}
	for _, p := range ports {
		for _, k := range keys(p) {
			out[k]++
		}
	}
	return out
}

// recount applies c to n, counts that count made, and returns the keys
// c brought into use and those no port uses any more (in no order). A
// key no port uses leaves n.
func recount[K comparable](n map[K]int, c Change, keys func(Port) []K) (add, del []K) {
	before := map[K]int{}
	apply := func(p Port, d int) {
		for _, k := range keys(p) {
			if _, ok := before[k]; !ok {
				before[k] = n[k]
			}
			if n[k] += d; n[k] <= 0 {
				delete(n, k)
			}
		}
	}
	for _, p := range c.Added {
		apply(p, 1)
	}
	for _, u := range c.Updated {
		apply(u.Old, -1)
		apply(u.New, 1)
	}
	for _, p := range c.Removed {
		apply(p, -1)
	}
	for k, was := range before {
		switch now := n[k]; {
		case was <= 0 && now > 0:
			add = append(add, k)
		case was > 0 && now <= 0:
			del = append(del, k)
		}
	}
	return add, del
}

// endpointAddrs lists p's endpoint addresses.
func endpointAddrs(p Port) []netip.Addr {
	out := make([]netip.Addr, len(p.Endpoints))
	for i, ep := range p.Endpoints {
		out[i] = ep.Addr()
	}
	return out
}

// udpEndpointAddrs lists p's endpoint addresses if p is a UDP port.
func udpEndpointAddrs(p Port) []netip.Addr {
	if p.Protocol != UDP {
		return nil
	}
	return endpointAddrs(p)
}

// forgetUDP deletes the conntrack entries of UDP flows to endpoints that
// are gone (the addresses of gone). UDP has no connection end: without this, a client that keeps
// its socket keeps being NATed to the old endpoint's address (kube-proxy
// does the same clean-up, kubernetes#59368). On the first sync, the
// endpoints of before are not known (the agent restarted, and Services or
// endpoints may have gone while it was down): every NATed UDP flow to an
// address of the cluster CIDR that is no UDP endpoint now is deleted.
func (s *Syncer) forgetUDP(gone []netip.Addr, cfg Config) {
	if !s.started {
		cluster := cfg.ClusterCIDR
		s.b.forgetUDP(func(f *netlink.ConntrackFlow) bool {
			to, ok := netip.AddrFromSlice(f.Reverse.SrcIP)
			if !ok {
				return false
			}
			to = to.Unmap()
			from, _ := netip.AddrFromSlice(f.Forward.DstIP)
			natted := from.Unmap() != to
			return natted && cluster.IsValid() && cluster.Contains(to) && s.udp[to] == 0
		})
		return
	}
	if len(gone) == 0 {
		return
	}
	s.b.forgetUDP(func(f *netlink.ConntrackFlow) bool {
		to, ok := netip.AddrFromSlice(f.Reverse.SrcIP)
		return ok && slices.Contains(gone, to.Unmap())
	})
}

// udpFlows matches UDP conntrack entries by a predicate.
type udpFlows func(*netlink.ConntrackFlow) bool

func (m udpFlows) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	return f.Forward.Protocol == unix.IPPROTO_UDP && m(f)
}

func (iptablesTables) forgetUDP(match func(*netlink.ConntrackFlow) bool) {
	netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, udpFlows(match))
}

// JumpCommands are the jump rules Sync keeps in the built-in chains, as
// the iptables commands that would add them (agent --dry-run prints them).
func JumpCommands() []string {
	out := make([]string, 0, len(jumps))
	for _, j := range jumps {
		out = append(out, fmt.Sprintf("iptables -t %s -A %s -m comment --comment %q -j %s", j.table, j.chain, j.comment, j.target))
	}
	return out
}

// ensureJumps creates Starling's entry chains and the jump rules into
// them. Chains must exist before jumps can point at them; restore then
// fills them atomically, so working rules are never flushed first.
func (t iptablesTables) ensureJumps() error {
	for _, j := range jumps {
		if ok, err := t.ipt.ChainExists(j.table, j.target); err != nil {
			return err
		} else if !ok {
			if err := t.ipt.NewChain(j.table, j.target); err != nil {
				return fmt.Errorf("create %s %s: %w", j.table, j.target, err)
			}
		}
	}
	for _, j := range jumps {
		if err := t.ipt.AppendUnique(j.table, j.chain, "-m", "comment", "--comment", j.comment, "-j", j.target); err != nil {
			return fmt.Errorf("jump %s %s -> %s: %w", j.table, j.chain, j.target, err)
		}
	}
	return nil
}

// canary is the cheap check run every second (two iptables calls): the
// canary rule is still in its chain in the nat and filter tables. Flushing
// a table (iptables -F, -t nat -F) or deleting the chain removes it;
// kube-proxy's canary only notices deleted chains.
func (t iptablesTables) canary() bool {
	for _, table := range []string{"nat", "filter"} {
		if ok, err := t.ipt.Exists(table, ChainCanary, "-j", "RETURN"); err != nil || !ok {
			return false
		}
	}
	return true
}
