// Package ingress is the HTTP(S) front door every node runs: a reverse
// proxy (net/http/httputil) that routes requests by host and path, as
// networking.k8s.io/v1 Ingresses say, to the ready endpoints of their
// backend Services on any node, with TLS certificates from
// kubernetes.io/tls Secrets chosen by SNI. Build is the pure part: the
// routing table of one view's Ingresses, Services and Secrets; Proxy
// serves a table and takes the next one without dropping a connection;
// Controller keeps the proxy's table that of the latest view.
package ingress

import (
	"cmp"
	"crypto/tls"
	"fmt"
	mrand "math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// PathType is how a path matches, as networking.k8s.io/v1 defines it:
// Exact (the whole path, case-sensitive) or Prefix (element by element,
// split on '/'; ImplementationSpecific is served as Prefix).
type PathType int

// Path types.
const (
	Prefix PathType = iota
	Exact
)

// Input is what a table is built from: the Ingresses, the endpoints of
// the Services they name, and their certificates.
type Input struct {
	Ingresses []Ingress
	// Ports are the Services' ports by "namespace/name".
	Ports map[string][]ServicePort
	// Cert returns the certificate of Secret namespace/name, or why
	// there is none (missing, not kubernetes.io/tls, a bad key pair).
	Cert func(namespace, name string) (*tls.Certificate, error)
	// Challenge returns the key authorization of an ACME HTTP-01
	// challenge token under way (nil: none).
	Challenge func(token string) (string, bool)
}

// ServicePort is one port of a Service with its ready endpoints.
type ServicePort struct {
	Name      string
	Port      uint16
	Endpoints []netip.AddrPort
}

// Ingress is one Ingress as the table reads it.
type Ingress struct {
	Namespace, Name string
	// Created orders conflicting Ingresses: the older one wins, as in
	// ingress-nginx, so a newcomer cannot take a host over.
	Created time.Time
	Rules   []Rule
	// Default is spec.defaultBackend (nil: none).
	Default *BackendRef
	TLS     []TLS
	// BodyBytes bounds a request's body (0: no bound); NoRedirect keeps
	// plain HTTP for its TLS hosts.
	BodyBytes  int64
	NoRedirect bool
	// ACME: its TLS entries' certificates are issued by the cluster's
	// ACME server (CertsDue).
	ACME bool
}

// Rule is one host's paths ("" host: any host; "*.example.com": one
// label under example.com).
type Rule struct {
	Host  string
	Paths []Path
}

// Path is one path of a rule.
type Path struct {
	Path    string
	Type    PathType
	Backend BackendRef
}

// BackendRef names a Service of the Ingress's namespace and one of its
// ports, by number or by name.
type BackendRef struct {
	Service  string
	Port     uint16
	PortName string
}

// TLS is one spec.tls entry: hosts served with the certificate of a
// Secret (no hosts: the certificate of every host of the Ingress's rules).
type TLS struct {
	Hosts  []string
	Secret string
}

// Backend is a resolved backend: the Service port a route sends to and
// its ready endpoints (none: the proxy answers 503).
type Backend struct {
	Service string // "namespace/name"
	Port    string // the port as the Ingress names it, for messages
	Found   bool   // the Service has that port
	// ServiceFound: the Service exists (with or without that port).
	ServiceFound bool
	Endpoints    []netip.AddrPort
	// next is the backend's round robin over its endpoints.
	next atomic.Uint64
}

// Route is where a matched request goes.
type Route struct {
	Ingress string // "namespace/name"
	Host    string // the rule's host ("" for any)
	Path    string
	Type    PathType
	Backend *Backend
	// Redirect: the host is one of the Ingress's TLS hosts, so a plain
	// HTTP request is redirected to HTTPS.
	Redirect  bool
	BodyBytes int64
}

// Table is the routing of one view: immutable once built.
type Table struct {
	exact    map[string][]Route // by host, best match first
	wildcard map[string][]Route // by the suffix after "*" (".example.com")
	anyHost  []Route
	// hostDef are the default backends by rule host ("shop.example.com",
	// "*.example.com", "" for the host-less rules): the oldest Ingress's
	// that names the host and has one. def is the oldest rule-less
	// Ingress's: the default of the hosts no Ingress names.
	hostDef map[string]*Route
	def     *Route
	// certs are the certificates by host ("*.example.com" for
	// wildcards), each valid for its host, the oldest Ingress's first;
	// defCert a TLS entry's without hosts.
	certs   map[string][]*tls.Certificate
	defCert *tls.Certificate
	// Problems are what the table could not take from its input (a
	// missing or bad certificate), one line each, sorted.
	Problems []string
	// secrets are the Secrets ("namespace/name") its TLS entries name.
	secrets map[string]bool
	// challenge is the input's Challenge.
	challenge func(token string) (string, bool)
}

// Build makes the table of in. Routes of one host from every Ingress
// are merged, as ingress-nginx merges them: an Exact path before a
// Prefix, a longer prefix before a shorter; among equal paths, the
// oldest Ingress (then the one whose key sorts first). A host's default
// backend is that of the oldest Ingress that names the host and has
// one, as ingress-nginx gives a host's server the default backend of
// the Ingress that made it: one namespace's defaultBackend never takes
// the requests of a host only another namespace names.
func Build(in Input) *Table {
	t := &Table{exact: map[string][]Route{}, wildcard: map[string][]Route{}, hostDef: map[string]*Route{}, certs: map[string][]*tls.Certificate{},
		secrets: map[string]bool{}, challenge: in.Challenge}
	ings := slices.Clone(in.Ingresses)
	slices.SortFunc(ings, func(a, b Ingress) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, ing := range ings {
		key := ing.Namespace + "/" + ing.Name
		tlsHosts := t.addCerts(ing, in.Cert)
		for _, r := range ing.Rules {
			for _, p := range r.Paths {
				rt := Route{Ingress: key, Host: r.Host, Path: p.Path, Type: p.Type, Backend: resolve(ing.Namespace, p.Backend, in.Ports),
					Redirect: !ing.NoRedirect && covered(tlsHosts, r.Host), BodyBytes: ing.BodyBytes}
				switch {
				case r.Host == "":
					t.anyHost = append(t.anyHost, rt)
				case strings.HasPrefix(r.Host, "*."):
					t.wildcard[r.Host[1:]] = append(t.wildcard[r.Host[1:]], rt)
				default:
					t.exact[r.Host] = append(t.exact[r.Host], rt)
				}
			}
		}
		if ing.Default == nil {
			continue
		}
		d := Route{Ingress: key, Path: "/", Backend: resolve(ing.Namespace, *ing.Default, in.Ports), BodyBytes: ing.BodyBytes}
		if len(ing.Rules) == 0 && t.def == nil {
			t.def = &d
		}
		for _, r := range ing.Rules {
			if _, taken := t.hostDef[r.Host]; !taken {
				hd := d
				hd.Host, hd.Redirect = r.Host, !ing.NoRedirect && covered(tlsHosts, r.Host) // a TLS host's default is redirected too
				t.hostDef[r.Host] = &hd
			}
		}
	}
	for _, rs := range t.exact {
		sortRoutes(rs)
	}
	for _, rs := range t.wildcard {
		sortRoutes(rs)
	}
	sortRoutes(t.anyHost)
	slices.Sort(t.Problems)
	t.Problems = slices.Compact(t.Problems)
	return t
}

// addCerts adds ing's certificates and returns its TLS hosts.
func (t *Table) addCerts(ing Ingress, certOf func(ns, name string) (*tls.Certificate, error)) map[string]bool {
	hosts := map[string]bool{}
	for _, e := range ing.TLS {
		t.secrets[ing.Namespace+"/"+e.Secret] = true
		var c *tls.Certificate
		var err error
		if certOf == nil {
			err = fmt.Errorf("no Secrets")
		} else {
			c, err = certOf(ing.Namespace, e.Secret)
		}
		if err != nil {
			t.Problems = append(t.Problems, fmt.Sprintf("ingress %s/%s: tls secret %q: %v", ing.Namespace, ing.Name, e.Secret, err))
		}
		names := e.Hosts
		if len(names) == 0 {
			if c != nil && t.defCert == nil {
				t.defCert = c
			}
			for _, r := range ing.Rules {
				names = append(names, r.Host)
			}
		}
		for _, h := range names {
			if h == "" {
				continue
			}
			hosts[h] = true
			if c != nil && validFor(c, h) {
				// One the name is not valid for is passed over, so it
				// does not hide a newer Ingress's good one.
				t.certs[h] = append(t.certs[h], c)
			}
		}
	}
	return hosts
}

// covered reports whether host (a rule's: exact or "*.") is one of
// hosts or under one of its wildcards.
func covered(hosts map[string]bool, host string) bool {
	if host == "" {
		return false
	}
	if hosts[host] {
		return true
	}
	i := strings.IndexByte(host, '.')
	return i > 0 && !strings.HasPrefix(host, "*.") && hosts["*"+host[i:]]
}

// validFor reports whether c is valid for host, a rule's ("*.example.com"
// for a wildcard). A certificate without a parsed leaf is taken as
// valid.
func validFor(c *tls.Certificate, host string) bool {
	if c.Leaf == nil {
		return true
	}
	if strings.HasPrefix(host, "*.") {
		// Valid for the wildcard if valid for one label under it.
		host = "x" + host[1:]
	}
	return c.Leaf.VerifyHostname(host) == nil
}

// resolve finds ref's Service port in ports.
func resolve(namespace string, ref BackendRef, ports map[string][]ServicePort) *Backend {
	b := &Backend{Service: namespace + "/" + ref.Service, Port: ref.PortName}
	b.next.Store(mrand.Uint64()) // nodes do not all start on the first endpoint
	if ref.PortName == "" {
		b.Port = fmt.Sprint(ref.Port)
	}
	_, b.ServiceFound = ports[b.Service]
	for _, p := range ports[b.Service] {
		if (ref.PortName != "" && p.Name == ref.PortName) || (ref.PortName == "" && p.Port == ref.Port) {
			b.Found, b.Endpoints = true, p.Endpoints
			break
		}
	}
	return b
}

// sortRoutes orders one host's routes best match first: Exact before
// Prefix, then the longer path; the sort is stable, so among equals the
// Ingress that came first (by key) wins.
func sortRoutes(rs []Route) {
	slices.SortStableFunc(rs, func(a, b Route) int {
		if a.Type != b.Type {
			return cmp.Compare(b.Type, a.Type) // Exact (1) first
		}
		return cmp.Compare(len(strings.TrimSuffix(b.Path, "/")), len(strings.TrimSuffix(a.Path, "/")))
	})
}

// Match returns the route of a request for host (no port, any case) and
// path: among the host's own rules if any Ingress names the host, else
// a wildcard's that covers it, else the rules for any host; then the
// default backend of that host's Ingresses (for a host no Ingress
// names: of the host-less rules' Ingresses, then of the rule-less
// ones). As in ingress-nginx, a host that has rules never falls through
// to another host's rules, to the host-less rules or to their default.
func (t *Table) Match(host, path string) (Route, bool) {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	key := host
	rs, named := t.exact[host]
	if !named {
		if i := strings.IndexByte(host, '.'); i > 0 {
			key = "*" + host[i:]
			rs, named = t.wildcard[host[i:]]
		}
	}
	if !named {
		key, rs = "", t.anyHost
	}
	if r, ok := first(rs, path); ok {
		return *r, true
	}
	if d := t.hostDef[key]; d != nil {
		return *d, true
	}
	if !named && t.def != nil {
		return *t.def, true
	}
	return Route{}, false
}

// first is the first of rs whose path matches path.
func first(rs []Route, path string) (*Route, bool) {
	for i := range rs {
		if matches(rs[i].Type, rs[i].Path, path) {
			return &rs[i], true
		}
	}
	return nil, false
}

// matches is networking.k8s.io/v1's path matching: Exact compares the
// whole path; Prefix compares element by element ("/foo" matches
// "/foo", "/foo/" and "/foo/bar", not "/foobar"; a trailing '/' of
// either is ignored).
func matches(typ PathType, rule, path string) bool {
	if typ == Exact {
		return rule == path
	}
	rule = strings.TrimSuffix(rule, "/")
	if rule == "" {
		return true
	}
	return path == rule || strings.HasPrefix(path, rule+"/")
}

// Certificate is the certificate for a TLS handshake naming serverName:
// the host's own, then a wildcard's, then the default one, each only if
// it is valid for the name (as ingress-nginx checks the certificate's
// names): nil when none is, and the proxy presents its own self-signed
// certificate. One Ingress's certificate is never shown for a name it
// does not cover.
func (t *Table) Certificate(serverName string) *tls.Certificate {
	host := strings.ToLower(strings.TrimSuffix(serverName, "."))
	cands := t.certs[host]
	if i := strings.IndexByte(host, '.'); i > 0 {
		cands = append(slices.Clip(cands), t.certs["*"+host[i:]]...)
	}
	for _, c := range append(slices.Clip(cands), t.defCert) {
		if c != nil && (c.Leaf == nil || c.Leaf.VerifyHostname(host) == nil) {
			return c
		}
	}
	return nil
}

// Challenge is the key authorization to answer for an ACME HTTP-01
// challenge token (RFC 8555, 8.3), if one is under way.
func (t *Table) Challenge(token string) (string, bool) {
	if t.challenge == nil {
		return "", false
	}
	return t.challenge(token)
}

// Routes returns every route of the table, the default backends last:
// what `describe ingress` lists.
func (t *Table) Routes() []Route {
	var out []Route
	for _, byHost := range []map[string][]Route{t.exact, t.wildcard} {
		hosts := make([]string, 0, len(byHost))
		for h := range byHost {
			hosts = append(hosts, h)
		}
		slices.Sort(hosts)
		for _, h := range hosts {
			out = append(out, byHost[h]...)
		}
	}
	out = append(out, t.anyHost...)
	hosts := make([]string, 0, len(t.hostDef))
	for h := range t.hostDef {
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	for _, h := range hosts {
		out = append(out, *t.hostDef[h])
	}
	if t.def != nil {
		out = append(out, *t.def)
	}
	return out
}
