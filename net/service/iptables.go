package service

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// The iptables rendering of the model, after kube-proxy's iptables proxier
// with Starling's names. Each valid port puts into the kernel:
//
//   - with endpoints: one rule in STARLING-SERVICES (ClusterIP . protocol .
//     port -> its STARLING-SVC- chain); a STARLING-SVC- chain (the
//     masquerade mark for traffic from outside the cluster CIDR, then one
//     jump per endpoint with `-m statistic --probability 1/(n-i)`, which
//     gives each of n endpoints 1/n); one STARLING-SEP- chain per endpoint
//     (hairpin mark, DNAT); with a NodePort, one rule in STARLING-NODEPORTS
//     to a STARLING-EXT- chain (mark, then the STARLING-SVC- chain); with
//     a LoadBalancer address, a second rule in STARLING-SERVICES to a
//     STARLING-LB- chain (as STARLING-EXT-, or with Local no mark and a
//     jump per endpoint of this node);
//   - without endpoints: REJECT rules in the filter table's
//     STARLING-REJECT, so a client is refused at once instead of timing
//     out.
//
// A change is rendered from the ports that changed alone: their own chains
// are rewritten (only those whose rules differ), their rules in the shared
// chains are deleted (-D) and added (-I/-A) one by one, and the chains
// they no longer use are flushed and deleted. Nothing else of the table is
// rendered, so the text, and the work of iptables-restore --noflush,
// follows the change (kube-proxy's partial sync, with no chain rewritten
// whole for one Service).

// natChain is one per-port chain of the nat table with its rules (rule
// specs: what follows "-A <chain> ").
type natChain struct {
	name  string
	rules []string
}

// portRules is what one port puts into the kernel (see above).
type portRules struct {
	dispatch []string   // rule specs in ChainServices: the ClusterIP's, the LoadBalancer address's (none without endpoints)
	nodePort string     // rule spec in ChainNodePorts ("")
	rejects  []string   // rule specs in ChainFilter
	chains   []natChain // its own chains: SVC, EXT, SEPs
}

// renderPort returns the rules of one canonical port (see Model).
func renderPort(p Port, cfg Config) portRules {
	var r portRules
	id := p.key().String()
	comment := `"` + commentText(id) + `"`
	pr := proto(p.Protocol)
	if len(p.Endpoints) == 0 {
		r.rejects = append(r.rejects, rejectRule(p.ClusterIP, p, comment))
		if p.NodePort != 0 {
			r.rejects = append(r.rejects, fmt.Sprintf("-m addrtype --dst-type LOCAL -p %s -m %s --dport %d -m comment --comment %s -j REJECT --reject-with icmp-port-unreachable",
				pr, pr, p.NodePort, comment))
		}
		if p.LoadBalancer.IsValid() {
			r.rejects = append(r.rejects, rejectRule(p.LoadBalancer, p, comment))
		}
		return r
	}
	svc := natChain{name: chainName(svcPrefix, id)}
	r.dispatch = []string{fmt.Sprintf("-d %s/32 -p %s -m %s --dport %d -m comment --comment %s -j %s", p.ClusterIP, pr, pr, p.Port, comment, svc.name)}
	if cfg.MasqueradeAll {
		svc.rules = append(svc.rules, "-j "+ChainMarkMasq)
	} else if cfg.ClusterCIDR.IsValid() {
		svc.rules = append(svc.rules, fmt.Sprintf("! -s %s -j %s", cfg.ClusterCIDR.Masked(), ChainMarkMasq))
	}
	seps := make([]natChain, 0, len(p.Endpoints))
	n := len(p.Endpoints)
	for i, ep := range p.Endpoints {
		sep := natChain{name: chainName(sepPrefix, id+"/"+ep.String())}
		svc.rules = append(svc.rules, pickRule(i, n, sep.name))
		// Hairpin: an endpoint reaching itself through its Service must
		// be masqueraded, or it would answer itself directly.
		sep.rules = []string{
			fmt.Sprintf("-s %s/32 -j %s", ep.Addr(), ChainMarkMasq),
			fmt.Sprintf("-p %s -m %s -j DNAT --to-destination %s", pr, pr, ep),
		}
		seps = append(seps, sep)
	}
	r.chains = append(r.chains, svc)
	if p.NodePort != 0 {
		ext := natChain{name: chainName(extPrefix, id), rules: []string{"-j " + ChainMarkMasq, "-j " + svc.name}}
		r.nodePort = fmt.Sprintf("-p %s -m %s --dport %d -m comment --comment %s -j %s", pr, pr, p.NodePort, comment, ext.name)
		r.chains = append(r.chains, ext)
	}
	r.chains = append(r.chains, seps...)
	lbRules(p, cfg, svc.name, seps, &r)
	return r
}

// lbRules adds to r what p's LoadBalancer address puts into the kernel:
// a dispatch rule to a STARLING-LB- chain, which marks for masquerade
// and goes to the port's STARLING-SVC- chain; with Local, which keeps
// the client's address (unless cfg.MasqueradeAll), it picks among the
// endpoint chains of this node's endpoints instead (seps are the port's,
// in the order of p.Endpoints), and rejects when there are none.
func lbRules(p Port, cfg Config, svc string, seps []natChain, r *portRules) {
	if !p.LoadBalancer.IsValid() {
		return
	}
	id := p.key().String()
	comment := `"` + commentText(id) + `"`
	pr := proto(p.Protocol)
	lb := natChain{name: chainName(lbPrefix, id)}
	if !p.Local {
		lb.rules = []string{"-j " + ChainMarkMasq, "-j " + svc}
	} else {
		local := lbEndpoints(p, cfg)
		if len(local) == 0 {
			r.rejects = append(r.rejects, rejectRule(p.LoadBalancer, p, comment))
			return
		}
		if cfg.MasqueradeAll {
			lb.rules = append(lb.rules, "-j "+ChainMarkMasq) // kube-proxy's --masquerade-all: all, Local too
		}
		for i, ep := range local {
			lb.rules = append(lb.rules, pickRule(i, len(local), seps[slices.Index(p.Endpoints, ep)].name))
		}
	}
	r.chains = append(r.chains, lb)
	r.dispatch = append(r.dispatch, fmt.Sprintf("-d %s/32 -p %s -m %s --dport %d -m comment --comment %s -j %s", p.LoadBalancer, pr, pr, p.Port, comment, lb.name))
}

// pickRule is the rule that sends the i-th of n endpoints its share
// (1/n): `-m statistic --probability 1/(n-i)` but for the last.
func pickRule(i, n int, chain string) string {
	if i < n-1 {
		return fmt.Sprintf("-m statistic --mode random --probability %.10f -j %s", 1/float64(n-i), chain)
	}
	return "-j " + chain
}

// rejectRule refuses connections to addr at p's port.
func rejectRule(addr netip.Addr, p Port, comment string) string {
	pr := proto(p.Protocol)
	return fmt.Sprintf("-d %s/32 -p %s -m %s --dport %d -m comment --comment %s -j REJECT --reject-with icmp-port-unreachable", addr, pr, pr, p.Port, comment)
}

// restoreText collects the parts of one iptables-restore --noflush input:
// chain declarations (which create or flush), rules, and chain deletions,
// per table.
type restoreText struct {
	natDecl, nat, natDel, filterDecl, filter strings.Builder
	lines                                    int // rule lines written
}

func (t *restoreText) declare(chain string) { fmt.Fprintf(&t.natDecl, ":%s - [0:0]\n", chain) }

func (t *restoreText) rule(b *strings.Builder, op, chain, spec string) {
	b.WriteString(op)
	b.WriteByte(' ')
	b.WriteString(chain)
	b.WriteByte(' ')
	b.WriteString(spec)
	b.WriteByte('\n')
	t.lines++
}

// writeChain declares (flushes) c and writes its rules.
func (t *restoreText) writeChain(c natChain) {
	t.declare(c.name)
	for _, r := range c.rules {
		t.rule(&t.nat, "-A", c.name, r)
	}
}

// drop flushes and deletes chain (after every rule that jumps to it is
// gone, in the same transaction).
func (t *restoreText) drop(chain string) {
	t.declare(chain)
	fmt.Fprintf(&t.natDel, "-X %s\n", chain)
}

func (t *restoreText) bytes() []byte {
	var out strings.Builder
	if t.natDecl.Len()+t.nat.Len()+t.natDel.Len() > 0 {
		out.WriteString("*nat\n")
		out.WriteString(t.natDecl.String())
		out.WriteString(t.nat.String())
		out.WriteString(t.natDel.String())
		out.WriteString("COMMIT\n")
	}
	if t.filterDecl.Len()+t.filter.Len() > 0 {
		out.WriteString("*filter\n")
		out.WriteString(t.filterDecl.String())
		out.WriteString(t.filter.String())
		out.WriteString("COMMIT\n")
	}
	return []byte(out.String())
}

// ChangeText renders c (which must not be a Config change) as one
// iptables-restore --noflush input applied on top of the rules of the
// model before c; empty when c is. Its cost follows c alone. New dispatch rules are inserted at the top of
// STARLING-SERVICES, so its last rule (to the NodePorts) stays last.
func ChangeText(c Change, cfg Config) []byte {
	var t restoreText
	replace := func(old, new portRules) {
		have := map[string][]string{}
		for _, ch := range old.chains {
			have[ch.name] = ch.rules
		}
		for _, ch := range new.chains {
			if rules, ok := have[ch.name]; !ok || !slices.Equal(rules, ch.rules) {
				t.writeChain(ch)
			}
			delete(have, ch.name)
		}
		for _, d := range old.dispatch {
			if !slices.Contains(new.dispatch, d) {
				t.rule(&t.nat, "-D", ChainServices, d)
			}
		}
		for _, d := range new.dispatch {
			if !slices.Contains(old.dispatch, d) {
				t.rule(&t.nat, "-I", ChainServices+" 1", d)
			}
		}
		if old.nodePort != new.nodePort {
			if old.nodePort != "" {
				t.rule(&t.nat, "-D", ChainNodePorts, old.nodePort)
			}
			if new.nodePort != "" {
				t.rule(&t.nat, "-A", ChainNodePorts, new.nodePort)
			}
		}
		for _, ch := range old.chains {
			if _, gone := have[ch.name]; gone {
				t.drop(ch.name)
			}
		}
		for _, r := range old.rejects {
			if !slices.Contains(new.rejects, r) {
				t.rule(&t.filter, "-D", ChainFilter, r)
			}
		}
		for _, r := range new.rejects {
			if !slices.Contains(old.rejects, r) {
				t.rule(&t.filter, "-A", ChainFilter, r)
			}
		}
	}
	for _, p := range c.Added {
		replace(portRules{}, renderPort(p, cfg))
	}
	for _, u := range c.Updated {
		replace(renderPort(u.Old, cfg), renderPort(u.New, cfg))
	}
	for _, p := range c.Removed {
		replace(renderPort(p, cfg), portRules{})
	}
	return t.bytes()
}

// fullText renders every port as iptables-restore --noflush inputs that
// replace all of Starling's chains, and delete stale (chains of the nat
// table named like a per-port chain that no port uses, from the kernel's
// listing). The per-port chains come in inputs of about maxLines rule
// lines (a port's chains stay together); the last input holds the entry
// chains, the deletions and the filter table, so traffic switches to the
// new rules in one step: the nft backend's time grows faster than
// linearly with the size of one transaction (one 170,000-line restore took
// over 5 min here).
func fullText(ports []Port, cfg Config, stale []string, maxLines int) [][]byte {
	var out [][]byte
	var t restoreText
	var dispatch, nodePorts, rejects []string
	used := map[string]bool{}
	// The chains every per-port chain may jump to come first.
	for _, c := range []string{ChainPostrouting, ChainMarkMasq, ChainCanary} {
		t.declare(c)
	}
	// The canary rule: a flush of the table removes it (see iptablesTables.canary).
	t.rule(&t.nat, "-A", ChainCanary, "-j RETURN")
	t.rule(&t.nat, "-A", ChainPostrouting, "-m mark ! --mark "+MasqMark+" -j RETURN")
	t.rule(&t.nat, "-A", ChainPostrouting, "-j MARK --xor-mark "+masqMarkBit)
	t.rule(&t.nat, "-A", ChainPostrouting, `-m comment --comment "starling: service traffic that needs SNAT" -j MASQUERADE --random-fully`)
	t.rule(&t.nat, "-A", ChainMarkMasq, "-j MARK --or-mark "+masqMarkBit)
	for _, p := range ports {
		r := renderPort(p, cfg)
		if t.lines >= maxLines {
			out = append(out, t.bytes())
			t = restoreText{}
		}
		for _, c := range r.chains {
			t.writeChain(c)
			used[c.name] = true
		}
		dispatch = append(dispatch, r.dispatch...)
		if r.nodePort != "" {
			nodePorts = append(nodePorts, r.nodePort)
		}
		rejects = append(rejects, r.rejects...)
	}
	// The last per-port chains go with the switch: a small table is one
	// call (each call costs the nft backend a read of the whole table).
	for _, c := range []string{ChainServices, ChainNodePorts} {
		t.declare(c)
	}
	for _, d := range dispatch {
		t.rule(&t.nat, "-A", ChainServices, d)
	}
	// NodePorts: destinations local to this node, checked last; not on
	// 127.0.0.0/8, which the kernel will not route to a pod
	// (route_localnet is off): a connection to localhost:NodePort finds
	// no listener and is refused at once instead of hanging.
	t.rule(&t.nat, "-A", ChainServices, "-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j "+ChainNodePorts)
	for _, n := range nodePorts {
		t.rule(&t.nat, "-A", ChainNodePorts, n)
	}
	// Chains of ports that are gone: flushed (so none references
	// another) and deleted. Only names of Starling's per-port chains are
	// taken from stale.
	slices.Sort(stale)
	for _, c := range slices.Compact(stale) {
		if isServiceChain(c) && !used[c] {
			t.drop(c)
		}
	}
	for _, c := range []string{ChainFilter, ChainForward, ChainCanary} {
		fmt.Fprintf(&t.filterDecl, ":%s - [0:0]\n", c)
	}
	t.rule(&t.filter, "-A", ChainCanary, "-j RETURN")
	for _, r := range forwardRules(cfg) {
		t.rule(&t.filter, "-A", ChainForward, r)
	}
	for _, r := range rejects {
		t.rule(&t.filter, "-A", ChainFilter, r)
	}
	return append(out, t.bytes())
}

// Rules returns the whole rule set for ports as one iptables-restore
// --noflush input (what a full sync writes, in one piece): for the dry
// run and tests. Output is deterministic: the same input, in any order,
// gives the same bytes.
func Rules(ports []Port, cfg Config) []byte {
	var m Model
	m.Update(ports, cfg)
	return slices.Concat(fullText(m.Ports(), cfg, nil, 1<<62)...)
}

// forwardRules are the rules of STARLING-FORWARD (jumped to from FORWARD),
// which make the forward path work whatever the host's FORWARD policy
// (Docker sets DROP):
//   - conntrack INVALID packets are dropped first, as kube-proxy does
//     (kubernetes#74839): a TCP segment from a backend far outside the
//     window is INVALID, skips the reverse NAT, and would reach the client
//     from the backend's own address, which resets the connection;
//   - marked Service traffic, and anything from or to the cluster CIDR
//     (pod to pod across nodes; NodePort and node-to-ClusterIP traffic
//     arriving, masqueraded, at the backend's node), is accepted;
//   - so are replies of accepted connections.
func forwardRules(cfg Config) []string {
	out := []string{
		`-m conntrack --ctstate INVALID -m comment --comment "starling: drop packets conntrack cannot match - kubernetes issue 74839" -j DROP`,
		`-m mark --mark ` + MasqMark + ` -m comment --comment "starling: forward service traffic" -j ACCEPT`,
	}
	if c := cfg.ClusterCIDR.Masked(); cfg.ClusterCIDR.IsValid() {
		out = append(out,
			fmt.Sprintf(`-s %s -m comment --comment "starling: forward pod traffic" -j ACCEPT`, c),
			fmt.Sprintf(`-d %s -m comment --comment "starling: forward pod traffic" -j ACCEPT`, c))
	}
	return append(out, "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
}
