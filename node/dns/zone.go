// Package dns is the cluster's DNS as every node answers it, with the
// Kubernetes DNS schema (github.com/kubernetes/dns, docs/specification.md):
// a zone made from the node's view (Build, pure: values in, records out)
// and a server (server.go) that answers names of the cluster domain from
// it and forwards the rest to the node's upstream resolvers through a
// cache (cache.go). The server runs as a process of its own
// (`starling dns-server`), so a restarted agent leaves it answering; the
// agent hands it each new zone as a file (Write).
package dns

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"
)

// TTL is the time to live of the cluster's answers, positive and
// negative, in seconds (CoreDNS's kubernetes plugin's default): a
// resolver's cache follows a change within it.
const TTL = 5

// Input is what a zone is made of: the cluster domain ("cluster.local"),
// the Services and the pods as the view holds them. It is what the agent
// writes for the server (JSON). Fields are only ever added, each with
// omitempty: a server reads a file with a field it does not know
// (encoding/json skips it: an upgraded agent beside the server process
// of the binary before, until the agent replaces it) and one without a
// field it knows (the zone has none of those records), so no version
// number is needed.
type Input struct {
	Domain   string    `json:"domain"`
	Services []Service `json:"services"`
	Pods     []Pod     `json:"pods,omitempty"`
	// Reverse are the cluster's address ranges (the service and pod
	// CIDRs): the reverse name of an address in them that the zone
	// holds no PTR of is NXDOMAIN here, not asked upstream.
	Reverse []netip.Prefix `json:"reverse,omitempty"`
}

// Pod is a pod's address and namespace: its A record
// (a-b-c-d.NS.pod.DOMAIN) and its address's PTR.
type Pod struct {
	IP        netip.Addr `json:"ip"`
	Namespace string     `json:"namespace"`
}

// Service is one Service as DNS answers it: its ClusterIP (invalid for a
// headless one), or the name an ExternalName Service stands for; its
// ports; and, for a headless Service, its ready endpoints.
type Service struct {
	Name         string     `json:"name"`
	Namespace    string     `json:"namespace"`
	ClusterIP    netip.Addr `json:"clusterIP,omitzero"`
	Headless     bool       `json:"headless,omitempty"`
	ExternalName string     `json:"externalName,omitempty"`
	Ports        []Port     `json:"ports,omitempty"`
	Endpoints    []Endpoint `json:"endpoints,omitempty"`
}

// Port is one port of a Service: its name ("" has no SRV record),
// protocol ("TCP", "UDP") and number (for a headless Service, the target
// port of its endpoints).
type Port struct {
	Name     string `json:"name,omitempty"`
	Protocol string `json:"protocol"`
	Port     uint16 `json:"port"`
}

// Endpoint is one ready endpoint of a headless Service: the replica's
// address and, when the replica's hostname is under the Service
// (hostname and subdomain, a StatefulSet's ordinals), that hostname.
type Endpoint struct {
	IP       netip.Addr `json:"ip"`
	Hostname string     `json:"hostname,omitempty"`
}

// Zone is the answers of the cluster domain: records by owner name
// (lower case, fully qualified), and the names that exist without
// records of their own (a namespace's "NS.svc.DOMAIN."), which answer
// NODATA, not NXDOMAIN.
type Zone struct {
	domain  string // "cluster.local."
	records map[string][]dns.RR
	exists  map[string]bool
	soa     *dns.SOA
	reverse []netip.Prefix
}

// Build makes the zone of in: for each Service, SVC.NS.svc.DOMAIN (A:
// its ClusterIP; a headless Service's ready endpoints; an ExternalName
// Service's CNAME), _PORT._PROTO.SVC.NS.svc.DOMAIN SRV records for its
// named ports, a headless Service's endpoints by hostname
// as HOST.SVC.NS.svc.DOMAIN, or by address as 10-22-1-5.SVC.NS.svc.DOMAIN,
// and PTR records for ClusterIPs and endpoints. Then for each pod,
// a-b-c-d.NS.pod.DOMAIN (A: only for a pod of that namespace with that
// address, as CoreDNS's "pods verified" mode answers; any other such
// name is NXDOMAIN) and, for an address with no PTR yet (a ready
// endpoint of a headless Service has its name there, by hostname as
// CoreDNS answers it), a PTR to that pod name.
func Build(in Input) *Zone {
	domain := dns.Fqdn(strings.ToLower(cmp.Or(in.Domain, "cluster.local")))
	z := &Zone{domain: domain, records: map[string][]dns.RR{}, exists: map[string]bool{domain: true, "svc." + domain: true, "pod." + domain: true},
		reverse: in.Reverse}
	z.soa = &dns.SOA{Hdr: dns.RR_Header{Name: domain, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: TTL},
		Ns: "ns.dns." + domain, Mbox: "hostmaster." + domain, Serial: 1, Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: TTL}
	z.add(z.soa) // the apex's SOA: tools find the zone by asking for it
	services := slices.Clone(in.Services)
	slices.SortFunc(services, func(a, b Service) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	for _, s := range services {
		svc := strings.ToLower(s.Name + "." + s.Namespace + ".svc." + domain)
		z.exists[strings.ToLower(s.Namespace+".svc."+domain)] = true
		z.exists[svc] = true
		switch {
		case s.ExternalName != "":
			z.add(&dns.CNAME{Hdr: hdr(svc, dns.TypeCNAME), Target: dns.Fqdn(s.ExternalName)})
			continue
		case s.ClusterIP.IsValid() && !s.Headless:
			z.address(svc, s.ClusterIP)
			z.ptr(s.ClusterIP, svc)
			for _, p := range s.Ports {
				if p.Name != "" {
					z.srv(p, svc, svc)
				}
			}
			continue
		}
		for _, e := range s.Endpoints {
			host := strings.ToLower(cmp.Or(e.Hostname, dashed(e.IP))) + "." + svc
			z.address(svc, e.IP)
			z.address(host, e.IP)
			z.ptr(e.IP, host)
			for _, p := range s.Ports {
				if p.Name != "" {
					z.srv(p, svc, host)
				}
			}
		}
	}
	pods := slices.Clone(in.Pods)
	slices.SortFunc(pods, func(a, b Pod) int { return cmp.Or(a.IP.Compare(b.IP), strings.Compare(a.Namespace, b.Namespace)) })
	for _, p := range pods {
		if !p.IP.IsValid() || p.Namespace == "" {
			continue
		}
		ns := strings.ToLower(p.Namespace + ".pod." + domain)
		z.exists[ns] = true
		name := dashed(p.IP) + "." + ns
		z.address(name, p.IP)
		if rev, err := dns.ReverseAddr(p.IP.String()); err == nil && len(z.records[rev]) == 0 {
			z.ptr(p.IP, name)
		}
	}
	return z
}

func hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: TTL}
}

// add adds rr under its owner name, once. The names between it and the
// cluster domain exist too ("_tcp.SVC.NS.svc.DOMAIN" above an SRV
// record): they answer NODATA, not NXDOMAIN, which a resolver would
// read as "nothing below" (RFC 8020).
func (z *Zone) add(rr dns.RR) {
	name := rr.Header().Name
	for n := name; dns.IsSubDomain(z.domain, n) && !z.exists[n]; {
		z.exists[n] = true
		i, end := dns.NextLabel(n, 0)
		if end {
			break
		}
		n = n[i:]
	}
	if !slices.ContainsFunc(z.records[name], func(o dns.RR) bool { return dns.IsDuplicate(o, rr) }) {
		z.records[name] = append(z.records[name], rr)
	}
}

// address adds an A (or AAAA) record of name for ip.
func (z *Zone) address(name string, ip netip.Addr) {
	if ip.Is4() {
		z.add(&dns.A{Hdr: hdr(name, dns.TypeA), A: ip.AsSlice()})
	} else {
		z.add(&dns.AAAA{Hdr: hdr(name, dns.TypeAAAA), AAAA: ip.AsSlice()})
	}
}

// ptr adds the PTR record of ip to name.
func (z *Zone) ptr(ip netip.Addr, name string) {
	rev, err := dns.ReverseAddr(ip.String())
	if err == nil {
		z.add(&dns.PTR{Hdr: hdr(rev, dns.TypePTR), Ptr: name})
	}
}

// srv adds the SRV record of port p of the Service svc, pointing at
// target.
func (z *Zone) srv(p Port, svc, target string) {
	name := "_" + strings.ToLower(p.Name) + "._" + strings.ToLower(cmp.Or(p.Protocol, "TCP")) + "." + svc
	z.add(&dns.SRV{Hdr: hdr(name, dns.TypeSRV), Priority: 0, Weight: 100, Port: p.Port, Target: target})
}

// dashed is an address as a DNS label: 10.22.1.5 is "10-22-1-5".
func dashed(ip netip.Addr) string {
	return strings.NewReplacer(".", "-", ":", "-").Replace(ip.String())
}

// Answer is what the zone says of question q: ok false when q is not
// the zone's to answer (outside the cluster domain and not the reverse
// name of an address the zone holds: forward it). Else the answer
// records of q's type (for a CNAME, the CNAME, not chased), and rcode
// NXDOMAIN for a name of the cluster domain that does not exist, with
// the zone's SOA as authority when there is no answer (negative
// caching, RFC 2308); REFUSED for a class other than IN (or ANY).
func (z *Zone) Answer(q dns.Question) (answer, authority []dns.RR, rcode int, ok bool) {
	name := strings.ToLower(q.Name)
	rrs, held := z.records[name]
	inDomain := dns.IsSubDomain(z.domain, name)
	ours := false // the reverse name of a cluster address the zone holds nothing of
	if ip, ok := reverseAddr(name); ok && !held {
		ours = slices.ContainsFunc(z.reverse, func(p netip.Prefix) bool { return p.Contains(ip) })
	}
	if !inDomain && !held && !ours {
		return nil, nil, 0, false
	}
	if q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY {
		return nil, nil, dns.RcodeRefused, true
	}
	if ours {
		return nil, nil, dns.RcodeNameError, true
	}
	if inDomain && !z.exists[name] {
		return nil, []dns.RR{z.soa}, dns.RcodeNameError, true
	}
	for _, rr := range rrs {
		if t := rr.Header().Rrtype; t == q.Qtype || t == dns.TypeCNAME && q.Qtype != dns.TypePTR || q.Qtype == dns.TypeANY {
			answer = append(answer, rr)
		}
	}
	if len(answer) == 0 && inDomain {
		authority = []dns.RR{z.soa}
	}
	return answer, authority, dns.RcodeSuccess, true
}

// reverseAddr is the IPv4 address a reverse name
// ("5.1.22.10.in-addr.arpa.") stands for.
func reverseAddr(name string) (netip.Addr, bool) {
	rest, ok := strings.CutSuffix(name, ".in-addr.arpa.")
	if !ok {
		return netip.Addr{}, false
	}
	o := strings.Split(rest, ".")
	if len(o) != 4 {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(o[3] + "." + o[2] + "." + o[1] + "." + o[0])
	return ip, err == nil
}

// String lists the zone's records, sorted, one per line (for tests and
// `starling dns`).
func (z *Zone) String() string {
	var lines []string
	for _, rrs := range z.records {
		for _, rr := range rrs {
			if rr == z.soa {
				continue // the same in every zone
			}
			lines = append(lines, strings.ReplaceAll(rr.String(), "\t", " "))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// Nameserver is the address of the node's DNS, which pods' resolv.conf
// names: the gateway of the node's pod subnet (its bridge's address),
// which pods reach directly, no NAT or conntrack in the way.
func Nameserver(subnet netip.Prefix) (netip.Addr, error) {
	if !subnet.IsValid() || !subnet.Addr().Is4() {
		return netip.Addr{}, fmt.Errorf("pod subnet %v: want an IPv4 prefix", subnet)
	}
	return subnet.Masked().Addr().Next(), nil
}
