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

// Port is one port of one Service with its endpoints.
type Port struct {
	Service   string // "namespace/name"
	Name      string // port name ("" for a single unnamed port)
	Protocol  string // "TCP" or "UDP"
	ClusterIP string
	Port      int32
	NodePort  int32 // 0: none
	// Endpoints are "ip:port" of ready replicas, any order.
	Endpoints []string
}

func (p Port) id() string { return p.Service + ":" + p.Name + "/" + p.Protocol }

// Config is what the rules depend on besides the Services.
type Config struct {
	// ClusterCIDR: traffic to a ClusterIP from outside it is masqueraded.
	ClusterCIDR string
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

func proto(p string) string { return strings.ToLower(p) }

// Rules returns iptables-restore input (for --noflush) holding every
// Starling rule of the nat and filter tables. Every chain it uses is
// declared, so restoring it replaces those chains' contents; chains of
// Services that are gone are listed in stale and deleted. Output is
// deterministic: the same input gives the same bytes.
func Rules(ports []Port, cfg Config, stale []string) []byte {
	ps := append([]Port(nil), ports...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].id() < ps[j].id() })
	var nat, natRules, filter, filterRules strings.Builder
	declare := func(b *strings.Builder, chain string) { fmt.Fprintf(b, ":%s - [0:0]\n", chain) }
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
		comment := fmt.Sprintf("%q", shorten(p.id()))
		if len(p.Endpoints) == 0 {
			// No ready endpoint: refuse at once instead of letting the
			// client time out.
			rule(&filterRules, "-A %s -d %s/32 -p %s -m %s --dport %d -m comment --comment %s -j REJECT --reject-with icmp-port-unreachable",
				ChainFilter, p.ClusterIP, proto(p.Protocol), proto(p.Protocol), p.Port, comment)
			if p.NodePort != 0 {
				rule(&filterRules, "-A %s -m addrtype --dst-type LOCAL -p %s -m %s --dport %d -m comment --comment %s -j REJECT --reject-with icmp-port-unreachable",
					ChainFilter, proto(p.Protocol), proto(p.Protocol), p.NodePort, comment)
			}
			continue
		}
		declare(&nat, svc)
		rule(&natRules, "-A %s -d %s/32 -p %s -m %s --dport %d -m comment --comment %s -j %s",
			ChainServices, p.ClusterIP, proto(p.Protocol), proto(p.Protocol), p.Port, comment, svc)
		if cfg.MasqueradeAll {
			rule(&natRules, "-A %s -j %s", svc, ChainMarkMasq)
		} else if cfg.ClusterCIDR != "" {
			rule(&natRules, "-A %s ! -s %s -j %s", svc, cfg.ClusterCIDR, ChainMarkMasq)
		}
		if p.NodePort != 0 {
			rule(&natRules, "-A %s -p %s -m %s --dport %d -m comment --comment %s -j %s",
				ChainNodePorts, proto(p.Protocol), proto(p.Protocol), p.NodePort, comment, ChainMarkMasq)
			rule(&natRules, "-A %s -p %s -m %s --dport %d -m comment --comment %s -j %s",
				ChainNodePorts, proto(p.Protocol), proto(p.Protocol), p.NodePort, comment, svc)
		}
		eps := append([]string(nil), p.Endpoints...)
		sort.Strings(eps)
		n := len(eps)
		for i, ep := range eps {
			sep := chainName(sepPrefix, p.id()+"/"+ep)
			declare(&nat, sep)
			if i < n-1 {
				rule(&natRules, "-A %s -m statistic --mode random --probability %.10f -j %s", svc, 1/float64(n-i), sep)
			} else {
				rule(&natRules, "-A %s -j %s", svc, sep)
			}
			ip := ep[:strings.LastIndex(ep, ":")]
			// Hairpin: an endpoint reaching itself through its Service
			// must be masqueraded, or it would answer itself directly.
			rule(&natRules, "-A %s -s %s/32 -j %s", sep, ip, ChainMarkMasq)
			rule(&natRules, "-A %s -p %s -m %s -j DNAT --to-destination %s", sep, proto(p.Protocol), proto(p.Protocol), ep)
		}
	}
	// NodePorts: destinations local to this node, checked last.
	rule(&natRules, "-A %s -m addrtype --dst-type LOCAL -j %s", ChainServices, ChainNodePorts)

	// Chains of Services and endpoints that are gone: declared (which
	// flushes them, so none references another) and deleted.
	var gone []string
	declared := nat.String()
	sort.Strings(stale)
	for _, c := range stale {
		if (strings.HasPrefix(c, svcPrefix) || strings.HasPrefix(c, sepPrefix)) && !strings.Contains(declared, ":"+c+" ") {
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
