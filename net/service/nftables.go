package service

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/coreos/go-iptables/iptables"
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/starling-orchestrator/starling/net/xtables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The nftables rendering of the model, after kube-proxy's nftables
// proxier, written over netlink (github.com/google/nftables; no nft
// binary) into a table of its own, ip starling:
//
//	map service-ips        ClusterIP . protocol . port : goto service-<H>
//	                       LoadBalancer address . protocol . port : goto loadbalancer-<H>
//	map service-nodeports  protocol . NodePort         : goto external-<H>
//	map no-endpoint-services / no-endpoint-nodeports   : goto reject-chain
//	map service-endpoints  ClusterIP . protocol . port . i : endpoint i's address . port
//	map nodeport-endpoints protocol . NodePort . i          : the same
//	set hairpin            endpoint address . the same address
//	chain services         ip daddr . meta l4proto . th dport vmap @service-ips
//	                       fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports
//	chain service-<H>      ip saddr != <cluster CIDR> jump mark-for-masquerade
//	                       goto pick-<N>
//	chain external-<H>     jump mark-for-masquerade; goto pick-nodeport-<N>
//	chain loadbalancer-<H> jump mark-for-masquerade (not with Local); goto pick-<N>
//	                       (its endpoints keyed in service-endpoints by the
//	                       LoadBalancer address; with Local, this node's only)
//	chain pick-<N>         dnat ip to ip daddr . meta l4proto . th dport . numgen random mod N map @service-endpoints
//	chain pick-nodeport-<N> dnat ip to meta l4proto . th dport . numgen random mod N map @nodeport-endpoints
//	chain masquerading     (postrouting) masquerade DNATed packets whose
//	                       source is their destination (hairpin), and
//	                       what carries 0x4000
//	base chains            nat prerouting/output -> services; nat
//	                       postrouting -> masquerading; filter input/
//	                       forward/output: new connections to a port
//	                       without endpoints are rejected at once;
//	                       forward drops conntrack-INVALID packets
//	                       (kubernetes#74839).
//
// This takes one step past kube-proxy's layout, which gives every
// endpoint a chain (hairpin mark, DNAT) and picks one with `numgen random
// mod N vmap { ... }`: here a port's endpoints are elements of one data
// map, keyed by the port and an index 0..N-1, and its chain goes to the
// chain shared by all ports with N endpoints, which looks the endpoint up
// with a random index below N, so each endpoint gets 1/N. An endpoint
// replaced by another changes one map element (and the hairpin set's)
// and no chain (no rule, no jump: the kernel does not walk the table to
// validate it), and a full sync writes one or two chains per port
// instead of N+1 (make bench).
//
// The lookups sit in the few shared pick chains, not in each port's
// chain, because the kernel walks every element of a map each time a
// rule in a chain new to it starts looking it up (nf_tables_bind_set): a
// lookup per port made a full sync of 10,000 Services take 30 s. A
// NodePort's packet carries the node's address, not the ClusterIP, so
// NodePorts have their own endpoint map, keyed by protocol and NodePort.
//
// A pod that reaches itself through its Service is masqueraded in
// postrouting, where after DNAT its source is its destination: the
// hairpin set holds "a . a" for every endpoint address a, counted over
// the ports that use it. Clients from outside the cluster CIDR are
// marked in the port's chain as before, so both hairpin and
// client-address rules stay what kube-proxy's are.
//
// Dispatch is one map lookup whatever the number of Services, so a
// Service or endpoint change touches its own chains and map elements
// alone: the kernel does not re-read 10,000 rules of a shared chain as
// iptables-nft does. Chain names are hashes of the port's key: nothing a
// peer says reaches a name.
//
// An accept in one table does not override a drop in another, so the
// accept rules that make a FORWARD policy of DROP (Docker's) harmless
// stay in the host's iptables: STARLING-FORWARD, jumped to from FORWARD,
// as the iptables backend writes it (forwardRules), kept and repaired
// with the table.

// nftBackend writes the model with nftables over one netlink socket kept
// open.
type nftBackend struct {
	conn    *nftables.Conn
	table   *nftables.Table
	sets    map[string]*nftables.Set
	fwd     *iptablesTables    // the host's iptables, for STARLING-FORWARD; nil: none
	hairpin map[netip.Addr]int // endpoint addresses in the hairpin set: how many ports use each
	picks   map[string]int     // the pick chains in the table: how many ports go to each
}

// NewNFTSyncer returns a Syncer that writes the ip starling table with
// nftables (netlink) in the current network namespace, and with forward
// set, STARLING-FORWARD in that iptables backend (the host's firewall,
// xtables.Detect). It fails when the kernel lacks nf_tables (the error
// says so) or forward's commands are missing.
func NewNFTSyncer(forward *xtables.Backend) (*Syncer, error) {
	b, err := newNFTBackend()
	if err != nil {
		return nil, err
	}
	if forward != nil {
		ipt, err := iptables.New(iptables.Path(forward.Iptables), iptables.Timeout(5))
		if err != nil {
			b.conn.CloseLasting()
			return nil, fmt.Errorf("%s: %w (install the Debian package iptables)", forward.Iptables, err)
		}
		b.fwd = &iptablesTables{ipt, forward.Restore}
	}
	return &Syncer{b: b}, nil
}

func newNFTBackend() (*nftBackend, error) {
	conn, err := nftables.New(nftables.AsLasting(), nftables.WithSockOptions(bigBuffers))
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	b := &nftBackend{conn: conn, table: &nftables.Table{Family: nftables.TableFamilyIPv4, Name: NFTTable}}
	three := nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
	two := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	b.sets = map[string]*nftables.Set{}
	for name, key := range map[string]nftables.SetDatatype{nftServiceIPs: three, nftNoEndpointServices: three, nftServiceNodePorts: two, nftNoEndpointNodePorts: two} {
		b.sets[name] = &nftables.Set{Table: b.table, Name: name, IsMap: true, KeyType: key, DataType: nftables.TypeVerdict}
	}
	// The endpoint maps' index is numgen's 32-bit integer. nft declares
	// it with typeof (NFTText), which it records in the set's user data;
	// without that record, nft cannot size a plain integer in a
	// concatenation and aborts listing the table, so the kernel's set
	// calls it a mark (4 bytes too), and `nft list` shows the index as a
	// mark (0x00000000).
	endpoint := nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)
	b.sets[nftServiceEndpoints] = &nftables.Set{Table: b.table, Name: nftServiceEndpoints, IsMap: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark), DataType: endpoint}
	b.sets[nftNodePortEndpoints] = &nftables.Set{Table: b.table, Name: nftNodePortEndpoints, IsMap: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark), DataType: endpoint}
	b.sets[nftHairpin] = &nftables.Set{Table: b.table, Name: nftHairpin,
		KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr)}
	// Does the kernel take an nftables table? A list answers without
	// changing anything.
	if _, err := conn.ListTablesOfFamily(nftables.TableFamilyIPv4); err != nil {
		conn.CloseLasting()
		return nil, fmt.Errorf("nftables: the kernel does not answer (module nf_tables, CONFIG_NF_TABLES): %w", err)
	}
	return b, nil
}

func (*nftBackend) name() string { return "nftables" }

// nlBuffer is the send and receive buffer of the netlink socket (bytes):
// one transaction is one sendmsg, which must fit the send buffer (a full
// sync of 10,000 Services is about 10 MB), and the kernel's answers to it
// the receive buffer. SO_*BUFFORCE goes past net.core.wmem_max (root);
// the kernel allocates only what a message uses.
const nlBuffer = 64 << 20

// bigBuffers sets nlBuffer on the socket, and asks for acknowledgements
// without a copy of each request (NETLINK_CAP_ACK).
func bigBuffers(c *mdnetlink.Conn) error {
	if err := c.SetOption(mdnetlink.CapAcknowledge, true); err != nil {
		return err
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_SNDBUFFORCE, unix.SO_RCVBUFFORCE} {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, nlBuffer); e != nil && serr == nil {
				serr = fmt.Errorf("netlink socket buffer: %w", e)
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// NFTSupported reports whether the kernel of the current network
// namespace takes nftables rules: a table is created and deleted in one
// transaction, which leaves nothing behind.
func NFTSupported() error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	t := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "starling-probe"})
	conn.AddChain(&nftables.Chain{Name: "probe", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	conn.DelTable(t)
	return conn.Flush()
}

// change applies c on top of the table (apply).
func (b *nftBackend) change(_ context.Context, c Change, cfg Config) error {
	if b.hairpin == nil {
		b.hairpin = map[netip.Addr]int{}
	}
	if b.picks == nil {
		b.picks = map[string]int{}
	}
	tx := nftChangeTx(c, cfg, b.hairpin, b.picks)
	return b.apply(&tx)
}

// apply writes tx: as one transaction when it is small (any change of a
// few ports), else in transactions of about txMessages messages, cut
// only where every chain is whole and no element is missing (a replaced
// element is deleted and added in one).
func (b *nftBackend) apply(tx *nftTx) error {
	t := &batcher{b: b}
	if err := b.replaceElements(t, tx.early.del, tx.early.add); err != nil {
		return err
	}
	for _, c := range slices.Concat(tx.picks, tx.add) {
		if err := b.addChain(c); err != nil {
			return err
		}
		if err := t.add(1 + 2*len(c.rules)); err != nil {
			return err
		}
	}
	for _, c := range tx.rewrite {
		ch := &nftables.Chain{Table: b.table, Name: c.name}
		b.conn.FlushChain(ch)
		if err := b.addRules(ch, c.rules); err != nil {
			return err
		}
		if err := t.add(1 + 2*len(c.rules)); err != nil {
			return err
		}
	}
	if err := b.replaceElements(t, tx.dispatch.del, tx.dispatch.add); err != nil {
		return err
	}
	if err := b.replaceElements(t, tx.late, nil); err != nil {
		return err
	}
	if err := b.dropChains(t, tx.gone); err != nil {
		return err
	}
	return t.flush()
}

// dropChains flushes the chains names, then deletes them: a chain can go
// only once no rule goes to it, and chains that go to one another go
// together. Counted in t.
func (b *nftBackend) dropChains(t *batcher, names []string) error {
	for _, op := range []func(*nftables.Chain){b.conn.FlushChain, b.conn.DelChain} {
		for _, name := range names {
			op(&nftables.Chain{Table: b.table, Name: name})
			if err := t.add(1); err != nil {
				return err
			}
		}
	}
	return nil
}

// replaceElements deletes del and adds add, in chunks of elemChunk keys
// with each key's deletion and addition in one chunk (so in one
// transaction: a replaced element is never missing), counted in t.
func (b *nftBackend) replaceElements(t *batcher, del, add []nftElem) error {
	type unit struct{ del, add []nftElem }
	units := map[[2]string]*unit{}
	get := func(e nftElem) *unit {
		k := [2]string{e.set, e.key}
		if units[k] == nil {
			units[k] = &unit{}
		}
		return units[k]
	}
	for _, e := range del {
		u := get(e)
		u.del = append(u.del, e)
	}
	for _, e := range add {
		u := get(e)
		u.add = append(u.add, e)
	}
	keys := slices.SortedFunc(maps.Keys(units), func(a, b [2]string) int { return strings.Compare(a[0]+a[1], b[0]+b[1]) })
	for chunk := range slices.Chunk(keys, elemChunk) {
		var d, a []nftElem
		for _, k := range chunk {
			d, a = append(d, units[k].del...), append(a, units[k].add...)
		}
		if err := b.elements(d, b.conn.SetDeleteElements); err != nil {
			return err
		}
		if err := b.elements(a, b.conn.SetAddElements); err != nil {
			return err
		}
		if err := t.add(len(chunk)); err != nil {
			return err
		}
	}
	return nil
}

func (b *nftBackend) addChain(c nftChain) error {
	ch := b.conn.AddChain(&nftables.Chain{Table: b.table, Name: c.name})
	return b.addRules(ch, c.rules)
}

func (b *nftBackend) addRules(ch *nftables.Chain, rules []nftRule) error {
	for _, r := range rules {
		ex, err := b.exprs(r)
		if err != nil {
			return err
		}
		b.conn.AddRule(&nftables.Rule{Table: b.table, Chain: ch, Exprs: ex})
	}
	return nil
}

// elements adds or deletes elems, grouped by set.
func (b *nftBackend) elements(elems []nftElem, op func(*nftables.Set, []nftables.SetElement) error) error {
	by := map[string][]nftables.SetElement{}
	for _, e := range elems {
		se := nftables.SetElement{Key: []byte(e.key)}
		switch {
		case nftVerdictMap(e.set):
			se.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: e.val}
		case e.val != "":
			se.Val = []byte(e.val)
		}
		by[e.set] = append(by[e.set], se)
	}
	for _, name := range slices.Sorted(maps.Keys(by)) {
		// One message per elemChunk elements: the element list is one
		// netlink attribute, whose length field has 16 bits (a longer
		// list is cut short, and elements go missing).
		for chunk := range slices.Chunk(by[name], elemChunk) {
			if err := op(b.sets[name], chunk); err != nil {
				return fmt.Errorf("nftables %s: %w", name, err)
			}
		}
	}
	return nil
}

// elemChunk is the most set elements put in one netlink message: each
// takes under 100 bytes, and the list must stay below 64 KiB.
const elemChunk = 400

// full makes the table hold exactly ports, in place: traffic keeps
// flowing through the old rules of a port until its own are written. It
// runs as several transactions of at most txMessages netlink messages
// (each message is acknowledged, and the answers to one transaction must
// fit the socket's receive buffer), each leaving every chain whole:
//  1. the table, its maps and sets, and the fixed and base chains
//     (rewritten);
//  2. the elements of service-endpoints and hairpin that are missing or
//     differ, diffed against what the kernel holds;
//  3. the pick chains, then every port's chains, created or flushed and
//     rewritten;
//  4. the dispatch maps' elements, diffed against the kernel (a
//     replaced element is deleted and added in one transaction);
//  5. the elements of step 2's sets that no port uses;
//  6. the per-port chains no port uses (an earlier run's, an earlier
//     version's, or a half-written sync's), flushed, then deleted.
//
// If the first step fails (a map of another type, left by another
// version), the table is deleted and written again; any other error is
// returned, and the next sync tries again in place.
func (b *nftBackend) full(ctx context.Context, ports []Port, cfg Config) error {
	if err := b.fullInPlace(ports, cfg); err != nil {
		if !errors.Is(err, errLayout) {
			return err
		}
		b.conn.AddTable(b.table)
		b.conn.DelTable(b.table)
		if derr := b.conn.Flush(); derr != nil {
			return errors.Join(err, derr)
		}
		if err := b.fullInPlace(ports, cfg); err != nil {
			return err
		}
	}
	return b.writeForward(ctx, cfg)
}

// errLayout: the table's maps and fixed chains could not be written in
// place.
var errLayout = errors.New("the table's layout cannot be updated in place")

// txMessages bounds the netlink messages of one transaction of a full
// sync.
const txMessages = 16000

// batcher sends the queued messages as a transaction once there are
// txMessages of them; flush sends the rest.
type batcher struct {
	b *nftBackend
	n int
}

// add counts k queued messages and sends them when there are enough.
// Call it only where the table is consistent (between chains).
func (t *batcher) add(k int) error {
	if t.n += k; t.n >= txMessages {
		return t.flush()
	}
	return nil
}

func (t *batcher) flush() error {
	t.n = 0
	if err := t.b.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return nil
}

func (b *nftBackend) fullInPlace(ports []Port, cfg Config) error {
	t := &batcher{b: b}
	b.conn.AddTable(b.table)
	for _, name := range nftSets {
		s := *b.sets[name]
		s.ID = 0 // a set of this transaction, if it is new
		b.sets[name] = &s
		if err := b.conn.AddSet(&s, nil); err != nil {
			return fmt.Errorf("nftables set %s: %w", name, err)
		}
	}
	if err := b.fixedChains(); err != nil {
		return err
	}
	if err := t.flush(); err != nil {
		return fmt.Errorf("%w: %w", errLayout, err)
	}
	have, err := b.chains()
	if err != nil {
		return err
	}
	want := map[string]map[string]string{}
	for _, name := range nftSets {
		want[name] = map[string]string{}
	}
	rendered := make([]nftPort, 0, len(ports))
	for _, p := range ports {
		r := renderNFT(p, cfg)
		rendered = append(rendered, r)
		for _, e := range r.elems {
			want[e.set][e.key] = e.val
		}
	}
	hairpin := count(ports, endpointAddrs)
	for a := range hairpin {
		want[nftHairpin][hairpinElem(a).key] = ""
	}
	var unused []nftElem
	for _, name := range []string{nftServiceEndpoints, nftNodePortEndpoints, nftHairpin} {
		del, err := b.syncElements(t, name, want[name], false)
		if err != nil {
			return err
		}
		unused = append(unused, del...)
	}
	used := map[string]bool{}
	picks := count(ports, picksUnder(cfg))
	for _, name := range slices.Sorted(maps.Keys(picks)) {
		c := pickFor(name)
		used[name] = true
		ch := b.conn.AddChain(&nftables.Chain{Table: b.table, Name: c.name})
		if have[c.name] {
			b.conn.FlushChain(ch)
		}
		if err := b.addRules(ch, c.rules); err != nil {
			return err
		}
	}
	if err := t.add(3 * len(picks)); err != nil {
		return err
	}
	for _, r := range rendered {
		for _, c := range r.chains {
			ch := b.conn.AddChain(&nftables.Chain{Table: b.table, Name: c.name})
			if have[c.name] {
				b.conn.FlushChain(ch)
			}
			if err := b.addRules(ch, c.rules); err != nil {
				return err
			}
			used[c.name] = true
			if err := t.add(2 + 2*len(c.rules)); err != nil {
				return err
			}
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	// Dispatch maps first: a port that gains endpoints is in
	// service-ips before it leaves no-endpoint-services (both at once
	// is harmless: the reject matches the ClusterIP, which DNAT has
	// replaced by then; neither would leave new connections hanging).
	for _, name := range []string{nftServiceIPs, nftServiceNodePorts, nftNoEndpointServices, nftNoEndpointNodePorts} {
		if _, err := b.syncElements(t, name, want[name], true); err != nil {
			return err
		}
	}
	if err := b.replaceElements(t, unused, nil); err != nil {
		return err
	}
	var stale []string
	for name := range have {
		if isNFTPortChain(name) && !used[name] {
			stale = append(stale, name)
		}
	}
	slices.Sort(stale)
	if err := b.dropChains(t, stale); err != nil {
		return err
	}
	if err := t.flush(); err != nil {
		return err
	}
	b.hairpin, b.picks = hairpin, picks
	return nil
}

// chains lists the chains of the table.
func (b *nftBackend) chains() (map[string]bool, error) {
	all, err := b.conn.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("nftables: list chains: %w", err)
	}
	out := map[string]bool{}
	for _, c := range all {
		if c.Table != nil && c.Table.Name == NFTTable {
			out[c.Name] = true
		}
	}
	return out, nil
}

// syncElements makes set name hold want (key -> value, as nftElem.val),
// changing only the elements that differ: it adds the missing ones and
// replaces those whose value differs, and deletes the ones want lacks if
// deleteNow, else returns them for the caller to delete later.
func (b *nftBackend) syncElements(t *batcher, name string, want map[string]string, deleteNow bool) (unused []nftElem, err error) {
	have, err := b.held(name)
	if err != nil {
		return nil, err
	}
	var del, add []nftElem
	for key, val := range have {
		w, ok := want[key]
		switch {
		case !ok && !deleteNow:
			unused = append(unused, nftElem{set: name, key: key})
		case !ok || w != val:
			del = append(del, nftElem{set: name, key: key})
		}
	}
	for key, val := range want {
		if v, ok := have[key]; !ok || v != val {
			add = append(add, nftElem{set: name, key: key, val: val})
		}
	}
	if err := b.replaceElements(t, del, add); err != nil {
		return nil, err
	}
	return unused, t.flush()
}

// held reads the elements of set name from the kernel: key -> value, as
// nftElem.val.
func (b *nftBackend) held(name string) (map[string]string, error) {
	els, err := b.conn.GetSetElements(b.sets[name])
	if err != nil {
		return nil, fmt.Errorf("nftables: elements of %s: %w", name, err)
	}
	have := make(map[string]string, len(els))
	for _, e := range els {
		if nftVerdictMap(name) {
			have[string(e.Key)] = verdictChain(e.Val)
		} else {
			have[string(e.Key)] = string(e.Val)
		}
	}
	return have, nil
}

// isNFTPortChain reports whether c is a name renderNFT gives a per-port
// or pick chain (or an earlier version gave a per-endpoint chain).
func isNFTPortChain(c string) bool {
	if strings.HasPrefix(c, nftPickPrefix) {
		return true
	}
	for _, p := range []string{nftSvcPrefix, nftExtPrefix, nftLBPrefix, nftSepPrefix} {
		if h, ok := strings.CutPrefix(c, p); ok && len(h) == chainNameHashLen {
			return true
		}
	}
	return false
}

// verdictChain is the chain of a verdict map element's data as
// google/nftables returns it (the NFTA_VERDICT_CODE and
// NFTA_VERDICT_CHAIN attributes); "" for another verdict.
func verdictChain(b []byte) string {
	ad, err := mdnetlink.NewAttributeDecoder(b)
	if err != nil {
		return ""
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_VERDICT_CHAIN {
			return strings.TrimRight(ad.String(), "\x00")
		}
	}
	return ""
}

// writeForward writes STARLING-FORWARD and the jump to it from FORWARD in
// the host's iptables.
func (b *nftBackend) writeForward(ctx context.Context, cfg Config) error {
	if b.fwd == nil {
		return nil
	}
	var t restoreText
	fmt.Fprintf(&t.filterDecl, ":%s - [0:0]\n", ChainForward)
	for _, r := range forwardRules(cfg) {
		t.rule(&t.filter, "-A", ChainForward, r)
	}
	if err := b.fwd.restore(ctx, t.bytes()); err != nil {
		return err
	}
	return b.fwd.ipt.AppendUnique("filter", "FORWARD", forwardJump...)
}

// forwardJump is the rule of FORWARD that jumps to STARLING-FORWARD.
var forwardJump = []string{"-m", "comment", "--comment", "starling: forward service traffic", "-j", ChainForward}

// fixedChains adds (or flushes and rewrites) the chains every port uses
// and the base chains.
func (b *nftBackend) fixedChains() error {
	add := func(name string, rules ...[]expr.Any) *nftables.Chain {
		ch := b.conn.AddChain(&nftables.Chain{Table: b.table, Name: name})
		b.conn.FlushChain(ch) // a full sync rewrites it in place
		for _, r := range rules {
			b.conn.AddRule(&nftables.Rule{Table: b.table, Chain: ch, Exprs: r})
		}
		return ch
	}
	mark := func(mask, xor uint32) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(xor)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		}
	}
	add(nftMarkMasq, mark(^uint32(masqBit), masqBit))
	add(nftMasquerading,
		// ct status dnat ip saddr . ip daddr @hairpin masquerade
		[]expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: nftHairpin},
			&expr.Masq{FullyRandom: true},
		},
		[]expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(masqBit), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
			&expr.Verdict{Kind: expr.VerdictReturn},
		},
		mark(^uint32(0), masqBit),
		[]expr.Any{&expr.Masq{FullyRandom: true}},
	)
	add(nftRejectChain, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3 /* ICMP port unreachable */}})
	add(nftServices, dispatchByAddr(nftServiceIPs), dispatchByNodePort(nftServiceNodePorts))
	add(nftEndpointsCheck, dispatchByAddr(nftNoEndpointServices), dispatchByNodePort(nftNoEndpointNodePorts))

	jump := func(to string) []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: to}} }
	ctState := func(bits uint32, v expr.Any) []expr.Any {
		return []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			v,
		}
	}
	newConn := ctState(expr.CtStateBitNEW, &expr.Verdict{Kind: expr.VerdictJump, Chain: nftEndpointsCheck})
	filterPrio := nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 10)
	for _, base := range []struct {
		name  string
		typ   nftables.ChainType
		hook  *nftables.ChainHook
		prio  *nftables.ChainPriority
		rules [][]expr.Any
	}{
		{"nat-prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest, [][]expr.Any{jump(nftServices)}},
		{"nat-output", nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest, [][]expr.Any{jump(nftServices)}},
		{"nat-postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource, [][]expr.Any{jump(nftMasquerading)}},
		{"filter-input", nftables.ChainTypeFilter, nftables.ChainHookInput, filterPrio, [][]expr.Any{newConn}},
		{"filter-forward", nftables.ChainTypeFilter, nftables.ChainHookForward, filterPrio, [][]expr.Any{
			ctState(expr.CtStateBitINVALID, &expr.Verdict{Kind: expr.VerdictDrop}), newConn}},
		{"filter-output", nftables.ChainTypeFilter, nftables.ChainHookOutput, filterPrio, [][]expr.Any{newConn}},
	} {
		ch := b.conn.AddChain(&nftables.Chain{Table: b.table, Name: base.name, Type: base.typ, Hooknum: base.hook, Priority: base.prio})
		b.conn.FlushChain(ch)
		for _, r := range base.rules {
			b.conn.AddRule(&nftables.Rule{Table: b.table, Chain: ch, Exprs: r})
		}
	}
	return nil
}

// dispatchByAddr is `ip daddr . meta l4proto . th dport vmap @set`.
func dispatchByAddr(set string) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
		&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: set, DestRegister: 0, IsDestRegSet: true},
	}
}

// dispatchByNodePort is `fib daddr type local ip daddr != 127.0.0.0/8
// meta l4proto . th dport vmap @set`: NodePorts on the node's own
// addresses, not on loopback, which the kernel will not route to a pod
// (route_localnet stays off, CVE-2020-8558): a connection to
// localhost:NodePort is refused at once instead of hanging.
func dispatchByNodePort(set string) []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(rtnLocal)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 0, 0}, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{127, 0, 0, 0}},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: set, DestRegister: 0, IsDestRegSet: true},
	}
}

// exprs is r as nftables expressions.
func (b *nftBackend) exprs(r nftRule) ([]expr.Any, error) {
	jumpMark := &expr.Verdict{Kind: expr.VerdictJump, Chain: nftMarkMasq}
	switch r.kind {
	case markAll:
		return []expr.Any{jumpMark}, nil
	case markUnless:
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net4Mask(r.cidr.Bits()), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: r.cidr.Masked().Addr().AsSlice()},
			jumpMark}, nil
	case gotoChain:
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: r.chain}}, nil
	case dnatMap:
		// The key in registers 1 (32-bit 8), 9, 10, 11: address,
		// protocol, port, a random index below mod; the endpoint's
		// address and port come back in 8 and 9.
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
			&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Numgen{Register: 11, Modulus: r.mod, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: 1, SetName: nftServiceEndpoints, DestRegister: 1, IsDestRegSet: true},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 9},
		}, nil
	case dnatNodePortMap:
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Numgen{Register: 10, Modulus: r.mod, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: 1, SetName: nftNodePortEndpoints, DestRegister: 1, IsDestRegSet: true},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 9},
		}, nil
	}
	return nil, fmt.Errorf("nftables: unknown rule kind %d", r.kind)
}

func net4Mask(bits int) []byte {
	m := make([]byte, 4)
	binary.BigEndian.PutUint32(m, ^uint32(0)<<(32-bits))
	if bits == 0 {
		clear(m)
	}
	return m
}

// intact reports whether the services chain still holds its two dispatch
// rules (`nft flush ruleset`, a deleted table or a flushed table all
// remove them), and STARLING-FORWARD its last rule and FORWARD the jump
// to it.
func (b *nftBackend) intact() bool {
	rules, err := b.conn.GetRules(b.table, &nftables.Chain{Table: b.table, Name: nftServices})
	if err != nil || len(rules) != 2 {
		return false
	}
	if b.fwd == nil {
		return true
	}
	ok, err := b.fwd.ipt.Exists("filter", "FORWARD", forwardJump...)
	if err != nil || !ok {
		return false
	}
	ok, err = b.fwd.ipt.Exists("filter", ChainForward, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	return err == nil && ok
}

func (*nftBackend) forgetUDP(match func(*netlink.ConntrackFlow) bool) {
	netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, udpFlows(match))
}

// RemoveNFT deletes the ip starling table if present (the agent switched
// to the iptables backend). It reports whether there was one.
func RemoveNFT() (bool, error) {
	conn, err := nftables.New()
	if err != nil {
		return false, err
	}
	if _, err := conn.ListTableOfFamily(NFTTable, nftables.TableFamilyIPv4); err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	conn.DelTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: NFTTable})
	return true, conn.Flush()
}

// NFTAvailable reports whether the kernel of the current network
// namespace answers nftables requests, changing nothing (a list): the dry
// run's view of NFTSupported.
func NFTAvailable() bool {
	conn, err := nftables.New()
	if err != nil {
		return false
	}
	_, err = conn.ListTablesOfFamily(nftables.TableFamilyIPv4)
	return err == nil
}
