package names

import (
	"context"
	"errors"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/starling-orchestrator/starling/node/api"
	dnszone "github.com/starling-orchestrator/starling/node/dns"
	"github.com/starling-orchestrator/starling/node/view"
)

// Lookup looks q.Name up (of type q.Type) as a pod of q.Namespace on
// this node resolves it: through the node's DNS, with the search path
// and ndots:5 of a ClusterFirst pod's resolv.conf (Searches), stopping
// at the first name that has records. With q.From, as that replica
// resolves it on its own node: here when the node's own record lists
// it, else through Peer of the live node whose record does (with
// q.Node set to it: a query forwarded once is answered where it lands
// or refused, never sent on). A peer's answer is checked to be its
// node's, for the namespace asked. Errors: api errors, 404 for a
// replica no live node runs.
func (s *Supervisor) Lookup(ctx context.Context, q api.DNSQuery) (api.DNSAnswer, error) {
	if q.Node != "" && q.Node != s.Self {
		return api.DNSAnswer{}, api.Errorf(http.StatusMisdirectedRequest, "a lookup for node %s reached node %s", q.Node, s.Self)
	}
	if q.From == "" {
		return s.lookup(ctx, q.Namespace, q.Name, q.Type)
	}
	v := s.Views.View()
	node, ok := nodeOf(v, s.Self, q.Namespace, q.From)
	switch {
	case node == s.Self:
		return s.lookup(ctx, q.Namespace, q.Name, q.Type)
	case q.Node != "":
		return api.DNSAnswer{}, api.Errorf(http.StatusNotFound, "replica %q of namespace %q does not run on node %s", q.From, q.Namespace, s.Self)
	case !ok:
		return api.DNSAnswer{}, api.Errorf(http.StatusNotFound, "replica %q of namespace %q runs on no live node that node %s knows of (see 'starling get replicas')", q.From, q.Namespace, s.Self)
	case s.Peer == nil:
		return api.DNSAnswer{}, api.Errorf(http.StatusServiceUnavailable, "replica %s runs on node %s, which node %s cannot ask", q.From, node, s.Self)
	}
	q.Node = node
	a, err := s.Peer(ctx, node, v.Statuses[node], q)
	switch {
	case err != nil:
		return api.DNSAnswer{}, api.Errorf(http.StatusBadGateway, "ask node %s, where replica %s runs: %s", node, q.From, api.OneLine(err.Error()))
	case a.Node != node || a.Namespace != q.Namespace:
		return api.DNSAnswer{}, api.Errorf(http.StatusBadGateway, "node %s answered as node %q for namespace %q", node, api.OneLine(a.Node), api.OneLine(a.Namespace))
	}
	return a, nil
}

// nodeOf is the live node whose record lists replica namespace/name, not
// terminating: self when its own does (a replica handed over may be
// listed by two for a moment), else the first by name.
func nodeOf(v *view.View, self, namespace, name string) (string, bool) {
	here := func(node string) bool {
		return slices.ContainsFunc(v.Statuses[node].Replicas, func(r api.Replica) bool {
			return r.Namespace == namespace && r.Name == name && r.Phase != api.PhaseTerminating
		})
	}
	if here(self) {
		return self, true
	}
	for _, node := range slices.Sorted(maps.Keys(v.Statuses)) {
		if v.Alive[node] && !v.Stale[node] && here(node) {
			return node, true
		}
	}
	return "", false
}

// lookup looks name up as a pod of namespace on this node (Lookup).
func (s *Supervisor) lookup(ctx context.Context, namespace, name, qtype string) (api.DNSAnswer, error) {
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
