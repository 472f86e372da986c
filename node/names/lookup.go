package names

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/starling-orchestrator/starling/node/api"
	dnszone "github.com/starling-orchestrator/starling/node/dns"
)

// Lookup looks name up (of type qtype) as a pod of namespace on this
// node resolves it: through the node's DNS, with the search path and
// ndots:5 of a ClusterFirst pod's resolv.conf (Searches), stopping at
// the first name that has records.
func (s *Supervisor) Lookup(ctx context.Context, namespace, name, qtype string) (api.DNSAnswer, error) {
	out := api.DNSAnswer{Node: s.Self, Namespace: namespace}
	st, ok := s.Views.View().Statuses[s.Self]
	subnet, err := netip.ParsePrefix(st.PodSubnet)
	if !ok || err != nil {
		return out, errors.New("the node has no pod subnet yet, so no DNS address")
	}
	server, err := dnszone.Nameserver(subnet)
	if err != nil {
		return out, err
	}
	out.Server = net.JoinHostPort(server.String(), "53")
	t, ok := dns.StringToType[qtype]
	if !ok {
		return out, api.Errorf(400, "type %q: not a DNS type", qtype)
	}
	c := &dns.Client{Timeout: 3 * time.Second}
	for _, candidate := range Searches(name, namespace, s.Domain) {
		out.Tried = append(out.Tried, candidate)
		m := new(dns.Msg)
		m.SetQuestion(candidate, t)
		r, _, err := c.ExchangeContext(ctx, m, out.Server)
		if err != nil {
			return out, err
		}
		out.Name, out.Rcode, out.Answers = candidate, dns.RcodeToString[r.Rcode], nil
		for _, rr := range r.Answer {
			out.Answers = append(out.Answers, strings.ReplaceAll(rr.String(), "\t", " "))
		}
		if r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
			break
		}
	}
	return out, nil
}

// Searches are the names a resolver with a ClusterFirst pod's
// resolv.conf (search NS.svc.DOMAIN svc.DOMAIN DOMAIN, ndots:5) asks
// for name, in order: a name with a trailing dot as it is; one with
// fewer than 5 dots under each search domain, then as it is; one with
// more as it is first.
func Searches(name, namespace, domain string) []string {
	if strings.HasSuffix(name, ".") {
		return []string{name}
	}
	var out []string
	for _, d := range []string{namespace + ".svc." + domain, "svc." + domain, domain} {
		out = append(out, dns.Fqdn(name+"."+d))
	}
	if strings.Count(name, ".") >= 5 {
		return append([]string{dns.Fqdn(name)}, out...)
	}
	return append(out, dns.Fqdn(name))
}
