// Package service turns Services and their endpoints into iptables rules,
// following kube-proxy's iptables proxier with Starling's names: a
// services dispatch chain, a chain per service port (STARLING-SVC-*), a
// chain per endpoint (STARLING-SEP-*), a nodeports chain, a mark chain
// that sets 0x4000/0x4000, and a postrouting chain that masquerades marked
// packets. Endpoints are picked with `-m statistic --mode random
// --probability 1/(n-i)`, which gives each of n endpoints 1/n.
//
// Rules is a pure function of (service ports, config) to the text of one
// iptables-restore --noflush call; Allocate assigns ClusterIPs and
// NodePorts deterministically. The node applies the text atomically and
// checks a canary chain every second (see Syncer).
package service

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// Chain names.
const (
	ChainServices     = "STARLING-SERVICES"    // nat: PREROUTING, OUTPUT
	ChainNodePorts    = "STARLING-NODEPORTS"   // nat: from SERVICES, local destinations
	ChainPostrouting  = "STARLING-POSTROUTING" // nat: POSTROUTING
	ChainMarkMasq     = "STARLING-MARK-MASQ"   // nat: sets MasqMark
	ChainFilter       = "STARLING-REJECT"      // filter: INPUT, FORWARD, OUTPUT; rejects ports without endpoints
	ChainForward      = "STARLING-FORWARD"     // filter: FORWARD; accepts marked and established traffic
	ChainCanary       = "STARLING-CANARY"      // nat and filter: gone means someone flushed the tables
	svcPrefix         = "STARLING-SVC-"
	sepPrefix         = "STARLING-SEP-"
	MasqMark          = "0x4000/0x4000"
	masqMarkBit       = "0x4000"
	commentMaxLen     = 200
	chainNameHashLen  = 12 // "STARLING-SVC-" + 12 = 25 < 29, iptables' limit
	chainNamePrefixes = 2
)

// Port is one port of one Service with its endpoints, as parsed values:
// nothing of it is pasted into rule text but numbers, addresses and names
// made safe by commentText.
type Port struct {
	Service   string   // "namespace/name"
	Name      string   // port name ("" for a single unnamed port)
	Protocol  Protocol // TCP or UDP; a port with another is left out
	ClusterIP netip.Addr
	Port      uint16
	NodePort  uint16 // 0: none
	// Endpoints are the ready replicas' addresses and target ports, any
	// order.
	Endpoints []netip.AddrPort
}

// Protocol is a Service port's protocol, as Kubernetes spells it.
type Protocol string

// The protocols Rules handles.
const (
	TCP Protocol = "TCP"
	UDP Protocol = "UDP"
)

func (p Port) id() string { return p.Service + ":" + p.Name + "/" + string(p.Protocol) }

// Config is what the rules depend on besides the Services.
type Config struct {
	// ClusterCIDR: traffic to a ClusterIP from outside it is masqueraded.
	ClusterCIDR netip.Prefix
	// MasqueradeAll marks all Service traffic (kube-proxy's
	// --masquerade-all), for hosts where bridged traffic cannot pass
	// netfilter and a same-node reply would bypass the reverse NAT.
	MasqueradeAll bool
}

// chainName makes a chain name from a hash of what it stands for, as
// kube-proxy does (iptables chain names are at most 28 characters).
func chainName(prefix, key string) string {
	sum := sha256.Sum256([]byte(key))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:chainNameHashLen]
}

func proto(p Protocol) string { return strings.ToLower(string(p)) }

// valid reports whether p can be written as rules: a known protocol, an
// IPv4 ClusterIP, a port number, and endpoints with IPv4 addresses and
// port numbers (others are dropped by Rules).
func (p Port) valid() bool {
	return (p.Protocol == TCP || p.Protocol == UDP) && p.ClusterIP.Is4() && p.Port != 0
}

// commentText keeps only the characters of Kubernetes names and the
// separators Starling puts between them, so a comment can never end its
// quotes or its line whatever a name holds.
func commentText(s string) string {
	s = strings.Map(func(c rune) rune {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '/', c == ':', c == '_':
			return c
		}
		return '_'
	}, s)
	return shorten(s)
}

// Rules returns iptables-restore input (for --noflush) holding every
// Starling rule of the nat and filter tables. Every chain it uses is
// declared, so restoring it replaces those chains' contents; chains of
// Services that are gone are listed in stale and deleted. Output is
// deterministic: the same input gives the same bytes.
func Rules(ports []Port, cfg Config, stale []string) []byte {
	ps := make([]Port, 0, len(ports))
	for _, p := range ports {
		if p.valid() {
			ps = append(ps, p)
		}
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].id() < ps[j].id() })
	var nat, natRules, filter, filterRules strings.Builder
	declared := map[string]bool{}
	declare := func(b *strings.Builder, chain string) {
		if b == &nat {
			declared[chain] = true
		}
		fmt.Fprintf(b, ":%s - [0:0]\n", chain)
	}
	rule := func(b *strings.Builder, format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }

	nat.WriteString("*nat\n")
	for _, c := range []string{ChainServices, ChainNodePorts, ChainPostrouting, ChainMarkMasq, ChainCanary} {
		declare(&nat, c)
	}
	// The canary rule: a flush of the table removes it (see Syncer.Healthy).
	rule(&natRules, "-A %s -j RETURN", ChainCanary)
	rule(&natRules, "-A %s -m mark ! --mark %s -j RETURN", ChainPostrouting, MasqMark)
	rule(&natRules, "-A %s -j MARK --xor-mark %s", ChainPostrouting, masqMarkBit)
	rule(&natRules, "-A %s -m comment --comment \"starling: service traffic that needs SNAT\" -j MASQUERADE --random-fully", ChainPostrouting)
	rule(&natRules, "-A %s -j MARK --or-mark %s", ChainMarkMasq, masqMarkBit)

	filter.WriteString("*filter\n")
	for _, c := range []string{ChainFilter, ChainForward, ChainCanary} {
		declare(&filter, c)
	}
	rule(&filterRules, "-A %s -j RETURN", ChainCanary)
	rule(&filterRules, "-A %s -m mark --mark %s -m comment --comment \"starling: forward service traffic\" -j ACCEPT", ChainForward, MasqMark)
	rule(&filterRules, "-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", ChainForward)

	for _, p := range ps {
		svc := chainName(svcPrefix, p.id())
		comment := `"` + commentText(p.id()) + `"`
		pr := proto(p.Protocol)
		var eps []netip.AddrPort
		for _, ep := range p.Endpoints {
			if ep.Addr().Is4() && ep.Port() != 0 {
				eps = append(eps, ep)
			}
		}
		if len(eps) == 0 {
			// No ready endpoint: refuse at once instead of letting the
			// client time out.
			rule(&filterRules, "-A %s -d %s/32 -p %s -m %s --dport %d -m comment --comment %s -j REJECT --reject-with icmp-port-unreachable",
				ChainFilter, p.ClusterIP, pr, pr, p.Port, comment)
			if p.NodePort != 0 {
				rule(&filterRules, "-A %s -m addrtype --dst-type LOCAL -p %s -m %s --dport %d -m comment --comment %s -j REJECT --reject-with icmp-port-unreachable",
					ChainFilter, pr, pr, p.NodePort, comment)
			}
			continue
		}
		declare(&nat, svc)
		rule(&natRules, "-A %s -d %s/32 -p %s -m %s --dport %d -m comment --comment %s -j %s",
			ChainServices, p.ClusterIP, pr, pr, p.Port, comment, svc)
		if cfg.MasqueradeAll {
			rule(&natRules, "-A %s -j %s", svc, ChainMarkMasq)
		} else if cfg.ClusterCIDR.IsValid() {
			rule(&natRules, "-A %s ! -s %s -j %s", svc, cfg.ClusterCIDR.Masked(), ChainMarkMasq)
		}
		if p.NodePort != 0 {
			rule(&natRules, "-A %s -p %s -m %s --dport %d -m comment --comment %s -j %s",
				ChainNodePorts, pr, pr, p.NodePort, comment, ChainMarkMasq)
			rule(&natRules, "-A %s -p %s -m %s --dport %d -m comment --comment %s -j %s",
				ChainNodePorts, pr, pr, p.NodePort, comment, svc)
		}
		slices.SortFunc(eps, func(a, b netip.AddrPort) int { return a.Compare(b) })
		eps = slices.Compact(eps)
		n := len(eps)
		for i, ep := range eps {
			sep := chainName(sepPrefix, p.id()+"/"+ep.String())
			declare(&nat, sep)
			if i < n-1 {
				rule(&natRules, "-A %s -m statistic --mode random --probability %.10f -j %s", svc, 1/float64(n-i), sep)
			} else {
				rule(&natRules, "-A %s -j %s", svc, sep)
			}
			// Hairpin: an endpoint reaching itself through its Service
			// must be masqueraded, or it would answer itself directly.
			rule(&natRules, "-A %s -s %s/32 -j %s", sep, ep.Addr(), ChainMarkMasq)
			rule(&natRules, "-A %s -p %s -m %s -j DNAT --to-destination %s", sep, pr, pr, ep)
		}
	}
	// NodePorts: destinations local to this node, checked last.
	rule(&natRules, "-A %s -m addrtype --dst-type LOCAL -j %s", ChainServices, ChainNodePorts)

	// Chains of Services and endpoints that are gone: declared (which
	// flushes them, so none references another) and deleted. Only names
	// of Starling's per-Service chains are taken from stale.
	var gone []string
	sort.Strings(stale)
	for _, c := range stale {
		if isServiceChain(c) && !declared[c] {
			gone = append(gone, c)
			declare(&nat, c)
		}
	}
	var out strings.Builder
	out.WriteString(nat.String())
	out.WriteString(natRules.String())
	for _, c := range gone {
		fmt.Fprintf(&out, "-X %s\n", c)
	}
	out.WriteString("COMMIT\n")
	out.WriteString(filter.String())
	out.WriteString(filterRules.String())
	out.WriteString("COMMIT\n")
	return []byte(out.String())
}

// isServiceChain reports whether c is a name chainName makes for a
// Service or endpoint chain.
func isServiceChain(c string) bool {
	var h string
	switch {
	case strings.HasPrefix(c, svcPrefix):
		h = c[len(svcPrefix):]
	case strings.HasPrefix(c, sepPrefix):
		h = c[len(sepPrefix):]
	default:
		return false
	}
	if len(h) != chainNameHashLen {
		return false
	}
	for _, ch := range h {
		if !('A' <= ch && ch <= 'Z' || '2' <= ch && ch <= '7') {
			return false
		}
	}
	return true
}

func shorten(s string) string {
	if len(s) > commentMaxLen {
		return s[:commentMaxLen]
	}
	return s
}

// Chains returns the per-service and per-endpoint chains of the nat table
// a Rules text declares (to find stale ones after the next sync).
func Chains(rules []byte) []string {
	var out []string
	nat := false
	for _, line := range strings.Split(string(rules), "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			nat = line == "*nat"
		case nat && (strings.HasPrefix(line, ":"+svcPrefix) || strings.HasPrefix(line, ":"+sepPrefix)):
			out = append(out, strings.Fields(line[1:])[0])
		}
	}
	return out
}
