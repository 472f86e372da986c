package dns

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
)

// Resolver is a parsed resolv.conf: what a pod's is made of, and where
// the node's DNS forwards the names outside the cluster domain.
type Resolver struct {
	Nameservers, Searches, Options []string
}

// ParseResolvConf reads nameserver, search/domain and options lines
// (resolv.conf(5)); other lines and comments are ignored.
func ParseResolvConf(b []byte) Resolver {
	var r Resolver
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line, _, _ = strings.Cut(line, ";")
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			r.Nameservers = append(r.Nameservers, f[1])
		case "search", "domain": // the last of them wins, as in glibc
			r.Searches = slices.Clone(f[1:])
		case "options":
			r.Options = append(r.Options, f[1:]...)
		}
	}
	return r
}

// HostResolver returns the node's resolver settings as a pod (or the
// node's DNS, which is reached from pods' namespaces' side of the
// bridge) may use them: those of hostConf (normally /etc/resolv.conf)
// without loopback nameservers, which answer only inside the node's own
// network namespace. When that leaves none (systemd-resolved's stub,
// 127.0.0.53) and upstream (its list of real servers,
// /run/systemd/resolve/resolv.conf) can be read, those are used, as
// Kubernetes advises for the kubelet's --resolv-conf.
func HostResolver(hostConf, upstream string) (Resolver, error) {
	b, err := os.ReadFile(hostConf)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Resolver{}, err
	}
	r := ParseResolvConf(b)
	r.Nameservers = slices.DeleteFunc(r.Nameservers, isLoopback)
	if len(r.Nameservers) == 0 {
		if ub, err := os.ReadFile(upstream); err == nil {
			u := ParseResolvConf(ub)
			u.Nameservers = slices.DeleteFunc(u.Nameservers, isLoopback)
			if len(u.Searches) == 0 {
				u.Searches = r.Searches
			}
			return u, nil
		}
	}
	return r, nil
}

func isLoopback(s string) bool {
	a, err := netip.ParseAddr(s)
	return err != nil || a.IsLoopback()
}

// Upstreams are r's nameservers as addresses to query ("IP:53").
func (r Resolver) Upstreams() []string {
	out := make([]string, 0, len(r.Nameservers))
	for _, ns := range r.Nameservers {
		out = append(out, net.JoinHostPort(ns, "53"))
	}
	return out
}
