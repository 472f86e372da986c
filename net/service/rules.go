// Package service programs Services into the kernel: a ClusterIP (and a
// NodePort, and a LoadBalancer Service's LAN address) per Service port,
// balanced over its ready endpoints.
//
// Model holds the Service ports as they are programmed and turns each
// update into a Change (ports added, updated, removed): a pure function of
// (programmed, desired), whose cost is a lookup per port. Backends render
// a Change alone, so a sync costs what changed, not the size of the table:
// the nftables backend (nftables.go, after kube-proxy's nftables proxier)
// in one netlink transaction, the iptables backend (iptables.go, after
// kube-proxy's iptables proxier) in one iptables-restore --noflush call;
// Syncer drives either. Allocate
// assigns ClusterIPs and NodePorts deterministically, AllocateLB the
// LoadBalancer addresses. Rules renders the
// whole rule set (the dry run).
package service

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
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
	lbPrefix          = "STARLING-LB-"
	extPrefix         = "STARLING-EXT-"
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
	// LoadBalancer is the Service's LAN address (type LoadBalancer), or
	// the zero Addr: traffic to it at Port goes to the endpoints as a
	// NodePort's does.
	LoadBalancer netip.Addr
	// Local is externalTrafficPolicy Local: traffic to LoadBalancer goes
	// to this node's endpoints only (those in Config.NodeSubnet) and keeps
	// its client's address (no masquerade).
	Local bool
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

// Config is what the rules depend on besides the Services.
type Config struct {
	// ClusterCIDR: traffic to a ClusterIP from outside it is masqueraded.
	ClusterCIDR netip.Prefix
	// MasqueradeAll marks all Service traffic (kube-proxy's
	// --masquerade-all), for hosts where bridged traffic cannot pass
	// netfilter and a same-node reply would bypass the reverse NAT.
	MasqueradeAll bool
	// NodeSubnet is this node's pod subnet: the endpoints of a Local port
	// (Port.Local) on this node.
	NodeSubnet netip.Prefix
}

// chainName makes a chain name from a hash of what it stands for, as
// kube-proxy does (iptables chain names are at most 28 characters).
func chainName(prefix, key string) string {
	sum := sha256.Sum256([]byte(key))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:chainNameHashLen]
}

func proto(p Protocol) string { return strings.ToLower(string(p)) }

// lbEndpoints are the endpoints traffic to p's LoadBalancer address goes
// to: all of them, or with Local those in this node's pod subnet.
func lbEndpoints(p Port, cfg Config) []netip.AddrPort {
	if !p.Local {
		return p.Endpoints
	}
	var out []netip.AddrPort
	for _, ep := range p.Endpoints {
		if cfg.NodeSubnet.IsValid() && cfg.NodeSubnet.Contains(ep.Addr()) {
			out = append(out, ep)
		}
	}
	return out
}

// valid reports whether p can be written as rules: a known protocol, an
// IPv4 ClusterIP, a port number, and endpoints with IPv4 addresses and
// port numbers (others are dropped by Rules).
func (p Port) valid() bool {
	return (p.Protocol == TCP || p.Protocol == UDP) && p.ClusterIP.Is4() && p.Port != 0 && (!p.LoadBalancer.IsValid() || p.LoadBalancer.Is4())
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

// isServiceChain reports whether c is a name chainName makes for a
// Service or endpoint chain.
func isServiceChain(c string) bool {
	var h string
	switch {
	case strings.HasPrefix(c, svcPrefix):
		h = c[len(svcPrefix):]
	case strings.HasPrefix(c, sepPrefix):
		h = c[len(sepPrefix):]
	case strings.HasPrefix(c, extPrefix):
		h = c[len(extPrefix):]
	case strings.HasPrefix(c, lbPrefix):
		h = c[len(lbPrefix):]
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
