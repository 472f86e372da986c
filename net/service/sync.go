package service

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	"github.com/coreos/go-iptables/iptables"
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

// Syncer applies Rules to the kernel of the current network namespace.
// It is not safe for concurrent use.
type Syncer struct {
	ipt    *iptables.IPTables
	last   []byte
	chains []string            // per-service chains of the last applied rules
	jumped bool                // jump rules known to be in place
	udp    map[netip.Addr]bool // UDP endpoint IPs of the last applied rules
	// applied holds, per nat chain, the rules last written to it, so a
	// sync rewrites only chains that changed (kube-proxy's partial sync).
	applied map[string]string
}

// NewSyncer finds iptables (the nft or legacy backend the host uses: the
// iptables command's own choice). Errors name the package to install.
func NewSyncer() (*Syncer, error) {
	ipt, err := iptables.New(iptables.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("iptables: %w (install the Debian package iptables)", err)
	}
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		return nil, fmt.Errorf("iptables-restore: %w (install the Debian package iptables)", err)
	}
	return &Syncer{ipt: ipt}, nil
}

// Sync writes the rules for ports in one atomic iptables-restore
// --noflush call (after making sure the jump rules exist), unless they
// equal what was applied last and the canary says nobody flushed them.
// It reports whether it wrote anything.
func (s *Syncer) Sync(ctx context.Context, ports []Port, cfg Config) (bool, error) {
	text := Rules(ports, cfg, s.chains)
	healthy := s.last != nil && s.Healthy()
	if bytes.Equal(text, s.last) && healthy {
		return false, nil
	}
	if !healthy || !s.jumped {
		if err := s.ensureJumps(); err != nil {
			return false, err
		}
	}
	if !healthy {
		s.applied = nil // someone flushed: write everything
	}
	batches, chains := partial(text, s.applied, batchLines)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for _, b := range batches {
		cmd := exec.CommandContext(ctx, "iptables-restore", "--noflush", "-w", "5")
		cmd.Stdin = bytes.NewReader(b)
		if out, err := cmd.CombinedOutput(); err != nil {
			s.applied = nil
			return false, fmt.Errorf("iptables-restore: %v: %s", err, strings.TrimSpace(string(out)))
		}
	}
	s.last, s.chains, s.applied = text, Chains(text), chains
	s.forgetUDP(ports)
	return true, nil
}

// batchLines bounds the rule lines of one iptables-restore call: the nft
// backend's time grows faster than linearly with the size of one
// transaction (a single 170,000-line restore took over 5 min here).
const batchLines = 20000

// partial reduces a full Rules text to what changed since applied (the
// nat chains' rules last written): the nat chains whose rules differ, or
// are new, are declared (flushed) and rewritten; unchanged ones are left
// out, so iptables-restore --noflush keeps them as they are; deletions
// and the (small) filter table are always written. With applied nil
// everything is written.
//
// The result is split into iptables-restore texts of about maxLines rule
// lines, cut only before a service chain (so a service chain and its
// endpoint chains travel together); the entry chains (services dispatch
// and nodeports), the deletions and the filter table come in the last
// one, so traffic switches to the new chains in one step. It also returns
// the rules per nat chain after all texts are applied.
func partial(full []byte, applied map[string]string, maxLines int) ([][]byte, map[string]string) {
	var order []string
	rules := map[string]*strings.Builder{}
	var deletes, filter []string
	section := ""
	for _, line := range strings.Split(string(full), "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			section = line
			if section == "*filter" {
				filter = append(filter, line)
			}
		case section == "*filter":
			filter = append(filter, line)
		case strings.HasPrefix(line, ":"):
			c := strings.Fields(line[1:])[0]
			if rules[c] == nil {
				rules[c] = &strings.Builder{}
				order = append(order, c)
			}
		case strings.HasPrefix(line, "-A "):
			c := strings.Fields(line)[1]
			if rules[c] == nil {
				rules[c] = &strings.Builder{}
				order = append(order, c)
			}
			rules[c].WriteString(line + "\n")
		case strings.HasPrefix(line, "-X "):
			deletes = append(deletes, line)
		}
	}
	now := map[string]string{}
	var batches [][]byte
	var decls, body strings.Builder
	lines := 0
	flush := func() {
		if decls.Len() > 0 {
			batches = append(batches, []byte("*nat\n"+decls.String()+body.String()+"COMMIT\n"))
		}
		decls.Reset()
		body.Reset()
		lines = 0
	}
	entry := map[string]bool{ChainServices: true, ChainNodePorts: true}
	for _, c := range order {
		r := rules[c].String()
		now[c] = r
		if prev, ok := applied[c]; ok && applied != nil && prev == r || entry[c] {
			continue
		}
		if lines >= maxLines && strings.HasPrefix(c, svcPrefix) {
			flush()
		}
		fmt.Fprintf(&decls, ":%s - [0:0]\n", c)
		body.WriteString(r)
		lines += strings.Count(r, "\n")
	}
	var last strings.Builder
	last.WriteString("*nat\n")
	var lastBody strings.Builder
	// What is left goes with the switch: a small change is one call (each
	// call costs the nft backend a read of the whole table).
	last.WriteString(decls.String())
	lastBody.WriteString(body.String())
	for _, c := range []string{ChainServices, ChainNodePorts} {
		r := rules[c].String()
		if prev, ok := applied[c]; ok && applied != nil && prev == r {
			continue
		}
		fmt.Fprintf(&last, ":%s - [0:0]\n", c)
		lastBody.WriteString(r)
	}
	last.WriteString(lastBody.String())
	for _, d := range deletes {
		last.WriteString(d + "\n")
		delete(now, strings.TrimPrefix(d, "-X "))
	}
	last.WriteString("COMMIT\n")
	for _, line := range filter {
		if line != "" {
			last.WriteString(line + "\n")
		}
	}
	return append(batches, []byte(last.String())), now
}

// forgetUDP deletes the conntrack entries of UDP flows to endpoints that
// are gone. UDP has no connection end: without this, a client that keeps
// its socket keeps being NATed to the old endpoint's address (kube-proxy
// does the same clean-up, kubernetes#59368).
func (s *Syncer) forgetUDP(ports []Port) {
	now := map[netip.Addr]bool{}
	for _, p := range ports {
		if p.Protocol != UDP {
			continue
		}
		for _, ep := range p.Endpoints {
			now[ep.Addr()] = true
		}
	}
	for ip := range s.udp {
		if now[ip] {
			continue
		}
		f := &netlink.ConntrackFilter{}
		if err := f.AddIP(netlink.ConntrackReplySrcIP, net.IP(ip.AsSlice())); err != nil {
			continue
		}
		if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
			continue
		}
		netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f)
	}
	s.udp = now
}

// ensureJumps creates Starling's entry chains and the jump rules into
// them. Chains must exist before jumps can point at them; restore then
// fills them atomically, so working rules are never flushed first.
// JumpCommands are the jump rules Sync keeps in the built-in chains, as
// the iptables commands that would add them (agent --dry-run prints them).
func JumpCommands() []string {
	out := make([]string, 0, len(jumps))
	for _, j := range jumps {
		out = append(out, fmt.Sprintf("iptables -t %s -A %s -m comment --comment %q -j %s", j.table, j.chain, j.comment, j.target))
	}
	return out
}

func (s *Syncer) ensureJumps() error {
	s.jumped = false
	for _, j := range jumps {
		if ok, err := s.ipt.ChainExists(j.table, j.target); err != nil {
			return err
		} else if !ok {
			if err := s.ipt.NewChain(j.table, j.target); err != nil {
				return fmt.Errorf("create %s %s: %w", j.table, j.target, err)
			}
		}
	}
	for _, j := range jumps {
		if err := s.ipt.AppendUnique(j.table, j.chain, "-m", "comment", "--comment", j.comment, "-j", j.target); err != nil {
			return fmt.Errorf("jump %s %s -> %s: %w", j.table, j.chain, j.target, err)
		}
	}
	s.jumped = true
	return nil
}

// Healthy is the cheap check run every second (two iptables calls): the
// canary rule is still in its chain in the nat and filter tables. Flushing
// a table (iptables -F, -t nat -F) or deleting the chain removes it;
// kube-proxy's canary only notices deleted chains.
func (s *Syncer) Healthy() bool {
	for _, table := range []string{"nat", "filter"} {
		if ok, err := s.ipt.Exists(table, ChainCanary, "-j", "RETURN"); err != nil || !ok {
			return false
		}
	}
	return true
}
