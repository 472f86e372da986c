package service

// The nftables table as values: the layout (nftables.go's comment), what
// one port puts into it (renderNFT), the changes between two models as
// one transaction's worth of chains and elements (nftTx), and the whole
// table in nft syntax for the dry run (NFTText). The netlink backend
// (nftables.go) writes these values as kernel bytecode;
// TestNFTTextIsWhatTheKernelHolds reads the kernel's table back with
// nft and compares it with NFTText.

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// NFTTable is the nftables table (family ip) the backend owns.
const NFTTable = "starling"

// Names in the table.
const (
	nftServices            = "services"
	nftMarkMasq            = "mark-for-masquerade"
	nftMasquerading        = "masquerading"
	nftRejectChain         = "reject-chain"
	nftEndpointsCheck      = "endpoints-check"
	nftServiceIPs          = "service-ips"
	nftServiceNodePorts    = "service-nodeports"
	nftNoEndpointServices  = "no-endpoint-services"
	nftNoEndpointNodePorts = "no-endpoint-nodeports"
	nftServiceEndpoints    = "service-endpoints"
	nftNodePortEndpoints   = "nodeport-endpoints"
	nftHairpin             = "hairpin"
	nftSvcPrefix           = "service-"
	nftExtPrefix           = "external-"
	nftLBPrefix            = "loadbalancer-"
	nftPickPrefix          = "pick-"
	nftPickNodePortPrefix  = "pick-nodeport-"
	nftSepPrefix           = "endpoint-" // chains of earlier versions, removed by a full sync
	masqBit                = 0x4000
	rtnLocal               = 2    // RTN_LOCAL: fib daddr type local
	ipsDstNAT              = 0x20 // IPS_DST_NAT: ct status dnat
)

// nftSets are the table's maps and sets, in the order a full sync
// writes their elements.
var nftSets = []string{nftServiceEndpoints, nftNodePortEndpoints, nftHairpin, nftServiceIPs, nftServiceNodePorts, nftNoEndpointServices, nftNoEndpointNodePorts}

// nftVerdictMap reports whether set maps keys to chains (the dispatch
// maps); the others map keys to data (the endpoint maps) or are plain
// sets (hairpin).
func nftVerdictMap(set string) bool {
	return set != nftServiceEndpoints && set != nftNodePortEndpoints && set != nftHairpin
}

// nftRule is one rule of a per-port chain, as parsed values. String gives
// it in nft syntax: what changes compare, and what logs and tests show.
type nftRule struct {
	kind  ruleKind
	cidr  netip.Prefix // markUnless
	chain string       // gotoChain
	mod   uint32       // dnatMap, dnatNodePortMap: the number of endpoints
}

type ruleKind uint8

const (
	markAll         ruleKind = iota // jump mark-for-masquerade
	markUnless                      // ip saddr != cidr jump mark-for-masquerade
	gotoChain                       // goto chain
	dnatMap                         // dnat to the endpoint at a random index below mod, by ClusterIP
	dnatNodePortMap                 // the same by NodePort
)

func (r nftRule) String() string {
	switch r.kind {
	case markAll:
		return "jump " + nftMarkMasq
	case markUnless:
		return fmt.Sprintf("ip saddr != %s jump %s", r.cidr, nftMarkMasq)
	case gotoChain:
		return "goto " + r.chain
	case dnatMap:
		return fmt.Sprintf("dnat ip to ip daddr . meta l4proto . th dport . numgen random mod %d map @%s", r.mod, nftServiceEndpoints)
	case dnatNodePortMap:
		return fmt.Sprintf("dnat ip to meta l4proto . th dport . numgen random mod %d map @%s", r.mod, nftNodePortEndpoints)
	}
	return "?"
}

// nftChain is one per-port chain.
type nftChain struct {
	name  string
	rules []nftRule
}

func (c nftChain) sameRules(o nftChain) bool { return slices.Equal(c.rules, o.rules) }

// nftElem is one element of set: its key bytes, its value (the chain of
// a verdict map's goto, the data bytes of service-endpoints, "" in the
// hairpin set), and show, the element in nft syntax
// ("10.23.0.10 . tcp . 80 : goto service-...").
type nftElem struct {
	set, key, val, show string
}

// nftPort is what one port puts into the table.
type nftPort struct {
	chains []nftChain // the external chain, then the port's chain
	elems  []nftElem
}

func protoNum(p Protocol) byte {
	if p == UDP {
		return unix.IPPROTO_UDP
	}
	return unix.IPPROTO_TCP
}

// ipKey is the key of service-ips and no-endpoint-services: address .
// protocol . port, each field padded to 4 bytes (nftables concatenation).
func ipKey(a netip.Addr, p Protocol, port uint16) string {
	k := make([]byte, 12)
	copy(k, a.AsSlice())
	k[4] = protoNum(p)
	binary.BigEndian.PutUint16(k[8:], port)
	return string(k)
}

// endpointKey is the key of service-endpoints: ipKey . index, the index
// in host byte order (numgen's register).
func endpointKey(a netip.Addr, p Protocol, port uint16, i int) string {
	return string(binary.NativeEndian.AppendUint32([]byte(ipKey(a, p, port)), uint32(i)))
}

// nodePortEndpointKey is the key of nodeport-endpoints: nodePortKey .
// index.
func nodePortEndpointKey(p Protocol, port uint16, i int) string {
	return string(binary.NativeEndian.AppendUint32([]byte(nodePortKey(p, port)), uint32(i)))
}

// endpointVal is the data of a service-endpoints element: address .
// port, the port padded to 4 bytes.
func endpointVal(ep netip.AddrPort) string {
	v := make([]byte, 8)
	copy(v, ep.Addr().AsSlice())
	binary.BigEndian.PutUint16(v[4:], ep.Port())
	return string(v)
}

// hairpinElem is the hairpin set's element for endpoint address a.
func hairpinElem(a netip.Addr) nftElem {
	k := a.As4()
	return nftElem{set: nftHairpin, key: string(k[:]) + string(k[:]), show: a.String() + " . " + a.String()}
}

// nodePortKey is the key of service-nodeports and no-endpoint-nodeports.
func nodePortKey(p Protocol, port uint16) string {
	k := make([]byte, 8)
	k[0] = protoNum(p)
	binary.BigEndian.PutUint16(k[4:], port)
	return string(k)
}

func ipShow(p Port) string {
	return fmt.Sprintf("%s . %s . %d", p.ClusterIP, proto(p.Protocol), p.Port)
}

func nodePortShow(p Port) string { return fmt.Sprintf("%s . %d", proto(p.Protocol), p.NodePort) }

// renderNFT returns what one canonical port (see Model) puts into the
// table, but for the hairpin set, which is counted over all ports
// (nftChangeTx).
func renderNFT(p Port, cfg Config) nftPort {
	var r nftPort
	id := p.key().String()
	if len(p.Endpoints) == 0 {
		r.elems = append(r.elems, nftElem{nftNoEndpointServices, ipKey(p.ClusterIP, p.Protocol, p.Port), nftRejectChain, ipShow(p) + " : goto " + nftRejectChain})
		if p.NodePort != 0 {
			r.elems = append(r.elems, nftElem{nftNoEndpointNodePorts, nodePortKey(p.Protocol, p.NodePort), nftRejectChain, nodePortShow(p) + " : goto " + nftRejectChain})
		}
		lbNFT(p, cfg, &r)
		return r
	}
	svc := nftChain{name: chainName(nftSvcPrefix, id)}
	if cfg.MasqueradeAll {
		svc.rules = append(svc.rules, nftRule{kind: markAll})
	} else if cfg.ClusterCIDR.IsValid() {
		svc.rules = append(svc.rules, nftRule{kind: markUnless, cidr: cfg.ClusterCIDR.Masked()})
	}
	n := uint32(len(p.Endpoints))
	svc.rules = append(svc.rules, nftRule{kind: gotoChain, chain: pickChain(n, false).name})
	for i, ep := range p.Endpoints {
		r.elems = append(r.elems, nftElem{nftServiceEndpoints, endpointKey(p.ClusterIP, p.Protocol, p.Port, i), endpointVal(ep),
			fmt.Sprintf("%s . %d : %s . %d", ipShow(p), i, ep.Addr(), ep.Port())})
	}
	r.elems = append(r.elems, nftElem{nftServiceIPs, ipKey(p.ClusterIP, p.Protocol, p.Port), svc.name, ipShow(p) + " : goto " + svc.name})
	if p.NodePort != 0 {
		ext := nftChain{name: chainName(nftExtPrefix, id), rules: []nftRule{{kind: markAll}, {kind: gotoChain, chain: pickChain(n, true).name}}}
		for i, ep := range p.Endpoints {
			r.elems = append(r.elems, nftElem{nftNodePortEndpoints, nodePortEndpointKey(p.Protocol, p.NodePort, i), endpointVal(ep),
				fmt.Sprintf("%s . %d : %s . %d", nodePortShow(p), i, ep.Addr(), ep.Port())})
		}
		// Before the port's chain: an earlier version's external
		// chain went to it, and a full sync cut between the two would
		// send NodePort packets to a lookup by ClusterIP.
		r.chains = append(r.chains, ext)
		r.elems = append(r.elems, nftElem{nftServiceNodePorts, nodePortKey(p.Protocol, p.NodePort), ext.name, nodePortShow(p) + " : goto " + ext.name})
	}
	r.chains = append(r.chains, svc)
	lbNFT(p, cfg, &r)
	return r
}

// lbNFT adds to r what p's LoadBalancer address puts into the table, as a
// second address of the port: its endpoints (with Local, this node's
// only) keyed by that address, which the pick chains DNAT by; a chain
// that marks for masquerade (but with Local, which keeps the client's
// address, unless cfg.MasqueradeAll) and picks one; its service-ips element. Without endpoints, a
// reject, as for the ClusterIP.
func lbNFT(p Port, cfg Config, r *nftPort) {
	if !p.LoadBalancer.IsValid() {
		return
	}
	show := fmt.Sprintf("%s . %s . %d", p.LoadBalancer, proto(p.Protocol), p.Port)
	key := ipKey(p.LoadBalancer, p.Protocol, p.Port)
	eps := lbEndpoints(p, cfg)
	if len(eps) == 0 {
		r.elems = append(r.elems, nftElem{nftNoEndpointServices, key, nftRejectChain, show + " : goto " + nftRejectChain})
		return
	}
	lb := nftChain{name: chainName(nftLBPrefix, p.key().String())}
	if !p.Local || cfg.MasqueradeAll {
		lb.rules = append(lb.rules, nftRule{kind: markAll})
	}
	lb.rules = append(lb.rules, nftRule{kind: gotoChain, chain: pickChain(uint32(len(eps)), false).name})
	for i, ep := range eps {
		r.elems = append(r.elems, nftElem{nftServiceEndpoints, endpointKey(p.LoadBalancer, p.Protocol, p.Port, i), endpointVal(ep),
			fmt.Sprintf("%s . %d : %s . %d", show, i, ep.Addr(), ep.Port())})
	}
	r.chains = append(r.chains, lb)
	r.elems = append(r.elems, nftElem{nftServiceIPs, key, lb.name, show + " : goto " + lb.name})
}

// pickChain is the chain that DNATs to one of n endpoints, chosen at
// random, of the port a packet is for: by ClusterIP, or with nodePort by
// NodePort.
func pickChain(n uint32, nodePort bool) nftChain {
	if nodePort {
		return nftChain{name: fmt.Sprintf("%s%d", nftPickNodePortPrefix, n), rules: []nftRule{{kind: dnatNodePortMap, mod: n}}}
	}
	return nftChain{name: fmt.Sprintf("%s%d", nftPickPrefix, n), rules: []nftRule{{kind: dnatMap, mod: n}}}
}

// pickNames lists the pick chains p's chains go to under cfg (the
// LoadBalancer chain of a Local port picks among this node's endpoints).
func pickNames(p Port, cfg Config) []string {
	if len(p.Endpoints) == 0 {
		return nil
	}
	n := uint32(len(p.Endpoints))
	out := []string{pickChain(n, false).name}
	if p.NodePort != 0 {
		out = append(out, pickChain(n, true).name)
	}
	if local := uint32(len(lbEndpoints(p, cfg))); p.LoadBalancer.IsValid() && local > 0 && local != n {
		out = append(out, pickChain(local, false).name)
	}
	return out
}

// picksUnder is pickNames under cfg, for count and recount.
func picksUnder(cfg Config) func(Port) []string {
	return func(p Port) []string { return pickNames(p, cfg) }
}

// pickFor is the pick chain named name, one of pickNames.
func pickFor(name string) nftChain {
	if s, ok := strings.CutPrefix(name, nftPickNodePortPrefix); ok {
		n, _ := strconv.ParseUint(s, 10, 32)
		return pickChain(uint32(n), true)
	}
	n, _ := strconv.ParseUint(strings.TrimPrefix(name, nftPickPrefix), 10, 32)
	return pickChain(uint32(n), false)
}

// nftChangeTx renders c, counting its endpoint addresses in hairpin
// (address -> ports that use it) and its pick chains in picks (name ->
// ports that go to it), both of which it updates: the hairpin elements
// and pick chains that come into use are added, those that go out of use
// deleted.
func nftChangeTx(c Change, cfg Config, hairpin map[netip.Addr]int, picks map[string]int) nftTx {
	var tx nftTx
	for _, p := range c.Added {
		tx.replace(nftPort{}, renderNFT(p, cfg))
	}
	for _, u := range c.Updated {
		tx.replace(renderNFT(u.Old, cfg), renderNFT(u.New, cfg))
	}
	for _, p := range c.Removed {
		tx.replace(renderNFT(p, cfg), nftPort{})
	}
	tx.handOver()
	add, del := recount(hairpin, c, endpointAddrs)
	slices.SortFunc(add, netip.Addr.Compare)
	slices.SortFunc(del, netip.Addr.Compare)
	for _, a := range add {
		tx.early.add = append(tx.early.add, hairpinElem(a))
	}
	for _, a := range del {
		tx.late = append(tx.late, hairpinElem(a))
	}
	newPicks, unused := recount(picks, c, picksUnder(cfg))
	slices.Sort(newPicks)
	slices.Sort(unused)
	for _, name := range newPicks {
		tx.picks = append(tx.picks, pickFor(name))
	}
	tx.gone = append(tx.gone, unused...) // after the chains that went to them
	return tx
}

// NFTChange renders c (not a Config change) as the nftables backend does
// before sending it, and returns how many chains it writes and elements
// it changes: what a sync of c costs besides the kernel (the bench times
// it).
func NFTChange(c Change, cfg Config) (chains, elems int) {
	tx := nftChangeTx(c, cfg, map[netip.Addr]int{}, map[string]int{})
	return len(tx.picks) + len(tx.add) + len(tx.rewrite) + len(tx.gone), len(tx.early.del) + len(tx.early.add) + len(tx.dispatch.del) + len(tx.dispatch.add) + len(tx.late)
}

// nftTx collects a change in the order that never leaves a packet
// without its way: elements of the endpoint maps and hairpin added or
// replaced (before a chain looks for them), new pick chains, new chains,
// rewritten chains, dispatch map elements deleted and added, the
// elements no chain uses any more, and the chains no longer used,
// flushed then deleted (pick chains last).
type nftTx struct {
	early        elemOps
	picks        []nftChain
	add, rewrite []nftChain
	dispatch     elemOps
	late         []nftElem
	gone         []string
}

// elemOps deletes del and adds add; a key in both is replaced.
type elemOps struct{ del, add []nftElem }

func (tx *nftTx) replace(old, new nftPort) {
	have := map[string]nftChain{}
	for _, c := range old.chains {
		have[c.name] = c
	}
	for _, c := range new.chains {
		o, ok := have[c.name]
		switch {
		case !ok:
			tx.add = append(tx.add, c)
		case !o.sameRules(c):
			tx.rewrite = append(tx.rewrite, c)
		}
		delete(have, c.name)
	}
	for _, c := range old.chains {
		if _, ok := have[c.name]; ok {
			tx.gone = append(tx.gone, c.name)
		}
	}
	type id struct{ set, key string }
	olds := make(map[id]nftElem, len(old.elems))
	for _, e := range old.elems {
		olds[id{e.set, e.key}] = e
	}
	for _, e := range new.elems {
		o, had := olds[id{e.set, e.key}]
		delete(olds, id{e.set, e.key})
		if had && o == e {
			continue
		}
		ops := &tx.early
		if nftVerdictMap(e.set) {
			ops = &tx.dispatch
		}
		if had {
			ops.del = append(ops.del, o)
		}
		ops.add = append(ops.add, e)
	}
	for _, e := range old.elems {
		if _, gone := olds[id{e.set, e.key}]; !gone {
			continue
		}
		if nftVerdictMap(e.set) {
			tx.dispatch.del = append(tx.dispatch.del, e)
		} else {
			tx.late = append(tx.late, e)
		}
	}
}

// handOver turns an endpoint-map key that one port of the change gives
// up and another takes (a port renamed, a ClusterIP or NodePort taken by
// another Service) into one replacement, or into nothing when the value
// is the same. replace sees one port at a time: it would add the key
// early (refused, or a no-op, as the old element is there) and delete it
// late, taking the new port's element with it.
func (tx *nftTx) handOver() {
	type id struct{ set, key string }
	added := map[id]int{}
	for i, e := range tx.early.add {
		added[id{e.set, e.key}] = i
	}
	same := map[int]bool{}
	late := tx.late[:0]
	for _, e := range tx.late {
		i, ok := added[id{e.set, e.key}]
		switch {
		case !ok:
			late = append(late, e)
		case tx.early.add[i].val == e.val:
			same[i] = true
		default:
			tx.early.del = append(tx.early.del, e)
		}
	}
	tx.late = late
	if len(same) > 0 {
		i := 0
		tx.early.add = slices.DeleteFunc(tx.early.add, func(nftElem) bool { i++; return same[i-1] })
	}
}

// nftFixed is the part of the table every port uses, in nft syntax: what
// fixedChains writes.
const nftFixed = `	chain mark-for-masquerade {
		meta mark set meta mark | 0x00004000
	}
	chain masquerading {
		ct status dnat ip saddr . ip daddr @hairpin masquerade fully-random
		meta mark & 0x00004000 == 0x00000000 return
		meta mark set meta mark ^ 0x00004000
		masquerade fully-random
	}
	chain reject-chain {
		reject
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
		fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports
	}
	chain endpoints-check {
		ip daddr . meta l4proto . th dport vmap @no-endpoint-services
		fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}
	chain filter-input {
		type filter hook input priority filter - 10; policy accept;
		ct state new jump endpoints-check
	}
	chain filter-forward {
		type filter hook forward priority filter - 10; policy accept;
		ct state invalid drop
		ct state new jump endpoints-check
	}
	chain filter-output {
		type filter hook output priority filter - 10; policy accept;
		ct state new jump endpoints-check
	}
`

// NFTText returns the table a full sync of ports writes, in nft syntax
// (what `nft -f` reads and `nft list table ip starling` prints, but for
// element order): for the dry run and for reading. Output is
// deterministic.
func NFTText(ports []Port, cfg Config) []byte {
	var m Model
	m.Update(ports, cfg)
	elems := map[string][]string{}
	var chains strings.Builder
	writeChain := func(c nftChain) {
		fmt.Fprintf(&chains, "\tchain %s {\n", c.name)
		for _, rule := range c.rules {
			fmt.Fprintf(&chains, "\t\t%s\n", rule)
		}
		chains.WriteString("\t}\n")
	}
	for _, name := range slices.Sorted(maps.Keys(count(m.Ports(), picksUnder(cfg)))) {
		writeChain(pickFor(name))
	}
	for _, p := range m.Ports() {
		r := renderNFT(p, cfg)
		for _, c := range r.chains {
			writeChain(c)
		}
		for _, e := range r.elems {
			elems[e.set] = append(elems[e.set], e.show)
		}
	}
	addrs := slices.SortedFunc(maps.Keys(count(m.Ports(), endpointAddrs)), netip.Addr.Compare)
	for _, a := range addrs {
		elems[nftHairpin] = append(elems[nftHairpin], hairpinElem(a).show)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table ip %s {\n", NFTTable)
	for _, set := range nftSets {
		switch set {
		case nftServiceEndpoints:
			fmt.Fprintf(&b, "\tmap %s {\n\t\ttypeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport\n", set)
		case nftNodePortEndpoints:
			fmt.Fprintf(&b, "\tmap %s {\n\t\ttypeof meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport\n", set)
		case nftHairpin:
			fmt.Fprintf(&b, "\tset %s {\n\t\ttype ipv4_addr . ipv4_addr\n", set)
		case nftServiceNodePorts, nftNoEndpointNodePorts:
			fmt.Fprintf(&b, "\tmap %s {\n\t\ttype inet_proto . inet_service : verdict\n", set)
		default:
			fmt.Fprintf(&b, "\tmap %s {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n", set)
		}
		if len(elems[set]) > 0 {
			fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(elems[set], ",\n\t\t\t     "))
		}
		b.WriteString("\t}\n")
	}
	b.WriteString(nftFixed)
	b.WriteString(chains.String())
	b.WriteString("}\n")
	return []byte(b.String())
}
