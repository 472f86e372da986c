package ingress

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/netip"
	"testing"
	"time"
)

func ep(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// tableOf builds a table over Services web (port 80, "http"), api (8080)
// and empty (80, no endpoints) in namespace default.
func tableOf(ings ...Ingress) *Table {
	return Build(Input{Ingresses: ings, Ports: map[string][]ServicePort{
		"default/web":   {{Name: "http", Port: 80, Endpoints: []netip.AddrPort{ep("10.244.1.2:8080")}}},
		"default/api":   {{Port: 8080, Endpoints: []netip.AddrPort{ep("10.244.2.2:9000")}}},
		"default/empty": {{Port: 80}},
	}})
}

func TestRoutesMatchAsKubernetesDefinesPaths(t *testing.T) {
	tb := tableOf(
		Ingress{Namespace: "default", Name: "a", Rules: []Rule{
			{Host: "shop.example.com", Paths: []Path{
				{Path: "/", Type: Prefix, Backend: BackendRef{Service: "web", PortName: "http"}},
				{Path: "/api", Type: Prefix, Backend: BackendRef{Service: "api", Port: 8080}},
				{Path: "/api/health", Type: Exact, Backend: BackendRef{Service: "web", Port: 80}},
			}},
			{Host: "*.example.com", Paths: []Path{{Path: "/", Type: Prefix, Backend: BackendRef{Service: "api", Port: 8080}}}},
		}},
		Ingress{Namespace: "default", Name: "b", Rules: []Rule{
			{Paths: []Path{{Path: "/any", Type: Prefix, Backend: BackendRef{Service: "empty", Port: 80}}}},
		}, Default: &BackendRef{Service: "web", Port: 80}},
	)
	for _, c := range []struct {
		host, path string
		service    string
		rulePath   string
	}{
		{"shop.example.com", "/", "default/web", "/"},
		{"SHOP.example.com.", "/cart", "default/web", "/"},
		{"shop.example.com", "/api", "default/api", "/api"},
		{"shop.example.com", "/api/", "default/api", "/api"},
		{"shop.example.com", "/api/v1", "default/api", "/api"},
		{"shop.example.com", "/apis", "default/web", "/"}, // element-wise: /api does not match /apis
		{"a.b.example.com", "/x", "default/web", "/"},     // named by no rule: not the host-less /any; default backend
		{"shop.example.com", "/api/health", "default/web", "/api/health"},
		{"shop.example.com", "/api/health/x", "default/api", "/api"}, // Exact only
		{"blog.example.com", "/x", "default/api", "/"},               // wildcard: one label
		{"a.b.example.com", "/any", "default/empty", "/any"},         // not the wildcard (two labels): the host-less rules
		{"example.com", "/x", "default/web", "/"},                    // not the wildcard: no label; default backend
		{"other.org", "/any/thing", "default/empty", "/any"},
	} {
		r, ok := tb.Match(c.host, c.path)
		if !ok || r.Backend.Service != c.service || r.Path != c.rulePath {
			t.Errorf("%s%s: got %s %q (ok %v), want %s %q", c.host, c.path, r.Backend.Service, r.Path, ok, c.service, c.rulePath)
		}
	}
	if r, _ := tb.Match("other.org", "/any"); r.Backend.Found != true || len(r.Backend.Endpoints) != 0 {
		t.Errorf("empty backend: found %v, %d endpoints; want found with none (503)", r.Backend.Found, len(r.Backend.Endpoints))
	}
	noDefault := tableOf(Ingress{Namespace: "default", Name: "a", Rules: []Rule{{Host: "x.org", Paths: []Path{{Path: "/", Backend: BackendRef{Service: "web", Port: 80}}}}}})
	if _, ok := noDefault.Match("y.org", "/"); ok {
		t.Error("a host no rule names matched without a default backend")
	}
}

func TestTheFirstIngressByKeyWinsAnEqualPath(t *testing.T) {
	rule := func(svc string) []Rule {
		return []Rule{{Host: "x.org", Paths: []Path{{Path: "/", Backend: BackendRef{Service: svc, Port: 8080}}}}}
	}
	tb := tableOf(Ingress{Namespace: "default", Name: "zz", Rules: rule("web")}, Ingress{Namespace: "default", Name: "aa", Rules: rule("api")})
	if r, _ := tb.Match("x.org", "/"); r.Ingress != "default/aa" {
		t.Errorf("got %s, want default/aa", r.Ingress)
	}
	if r, _ := tb.Match("x.org", "/"); r.Backend.Service != "default/api" || !r.Backend.Found {
		t.Errorf("backend %+v", r.Backend)
	}
	if r, _ := tableOf(Ingress{Namespace: "default", Name: "p", Rules: rule("web")}).Match("x.org", "/"); r.Backend.Found {
		t.Error("web has no port 8080, but the backend was found")
	}
}

func TestCertificatesFollowSNIAndTLSHostsRedirect(t *testing.T) {
	a, b, d := &tls.Certificate{}, &tls.Certificate{}, &tls.Certificate{}
	certs := map[string]*tls.Certificate{"a": a, "b": b, "d": d}
	in := Input{Ports: map[string][]ServicePort{}, Cert: func(ns, name string) (*tls.Certificate, error) {
		if c, ok := certs[name]; ok {
			return c, nil
		}
		return nil, errors.New("no such Secret")
	}}
	paths := []Path{{Path: "/", Backend: BackendRef{Service: "web", Port: 80}}}
	in.Ingresses = []Ingress{
		{Namespace: "default", Name: "one", TLS: []TLS{{Hosts: []string{"a.org"}, Secret: "a"}, {Hosts: []string{"*.b.org"}, Secret: "b"}, {Hosts: []string{"gone.org"}, Secret: "missing"}},
			Rules: []Rule{{Host: "a.org", Paths: paths}, {Host: "plain.org", Paths: paths}, {Host: "gone.org", Paths: paths}}},
		{Namespace: "default", Name: "two", TLS: []TLS{{Secret: "d"}}, NoRedirect: true, Rules: []Rule{{Host: "d.org", Paths: paths}}},
	}
	tb := Build(in)
	for name, want := range map[string]*tls.Certificate{"a.org": a, "x.b.org": b, "d.org": d, "unknown.org": d} {
		if got := tb.Certificate(name); got != want {
			t.Errorf("certificate for %s: wrong one", name)
		}
	}
	if len(tb.Problems) != 1 {
		t.Errorf("problems %q, want the missing Secret", tb.Problems)
	}
	for host, want := range map[string]bool{"a.org": true, "gone.org": true, "plain.org": false, "d.org": false} {
		if r, _ := tb.Match(host, "/"); r.Redirect != want {
			t.Errorf("%s: redirect %v, want %v", host, r.Redirect, want)
		}
	}
}

// TestANamedHostNeverFallsThroughAndTheOldestIngressWins: a request for
// a host some Ingress names goes by that host's rules (or the default
// backend), never by another Ingress's host-less rules; a newer Ingress
// of another namespace cannot take a host's path over.
func TestANamedHostNeverFallsThroughAndTheOldestIngressWins(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	rule := func(host, path, svc string) []Rule {
		return []Rule{{Host: host, Paths: []Path{{Path: path, Backend: BackendRef{Service: svc, Port: 80}}}}}
	}
	tb := Build(Input{Ingresses: []Ingress{
		{Namespace: "prod", Name: "shop", Created: t0, Rules: rule("shop.test", "/", "web")},
		{Namespace: "a", Name: "thief", Created: t0.Add(time.Hour), Rules: append(rule("shop.test", "/", "evil"), rule("", "/other", "catch")...)},
		{Namespace: "prod", Name: "api", Created: t0, Rules: rule("api.test", "/v1", "api")},
	}})
	if r, _ := tb.Match("shop.test", "/"); r.Ingress != "prod/shop" {
		t.Errorf("shop.test/ went to %s, want the older prod/shop", r.Ingress)
	}
	if r, ok := tb.Match("api.test", "/other"); ok {
		t.Errorf("api.test/other went to %s, the host-less rules of another Ingress", r.Ingress)
	}
	if r, ok := tb.Match("unnamed.test", "/other"); !ok || r.Backend.Service != "a/catch" {
		t.Errorf("a host no rule names: %+v %v, want the host-less rule", r, ok)
	}
}

// TestACertificateIsShownOnlyForNamesItCovers: a TLS entry without
// hosts is the default certificate only for the names in it; a wildcard
// TLS host makes its subdomains' rules redirect.
func TestACertificateIsShownOnlyForNamesItCovers(t *testing.T) {
	mk := func(names ...string) *tls.Certificate {
		return &tls.Certificate{Leaf: &x509.Certificate{DNSNames: names}}
	}
	wild, other := mk("*.shop.test"), mk("other.test")
	certs := map[string]*tls.Certificate{"wild": wild, "other": other}
	tb := Build(Input{Cert: func(ns, name string) (*tls.Certificate, error) { return certs[name], nil },
		Ingresses: []Ingress{
			{Namespace: "a", Name: "x", TLS: []TLS{{Hosts: []string{"*.shop.test"}, Secret: "wild"}},
				Rules: []Rule{{Host: "cart.shop.test", Paths: []Path{{Path: "/", Backend: BackendRef{Service: "s", Port: 80}}}}}},
			{Namespace: "b", Name: "y", TLS: []TLS{{Secret: "other"}}},
		}})
	for name, want := range map[string]*tls.Certificate{"cart.shop.test": wild, "other.test": other, "unknown.test": nil, "shop.test": nil} {
		if got := tb.Certificate(name); got != want {
			t.Errorf("certificate for %s: %v, want %v", name, got, want)
		}
	}
	if r, _ := tb.Match("cart.shop.test", "/"); !r.Redirect {
		t.Error("cart.shop.test is covered by *.shop.test's TLS entry but does not redirect")
	}
}

// TestAHostsDefaultBackendIsItsOwnIngresss: a host's unmatched paths go
// to the defaultBackend of an Ingress that names the host, never to
// another namespace's; a rule-less Ingress's default takes only hosts
// no Ingress names.
func TestAHostsDefaultBackendIsItsOwnIngresss(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	rule := func(host, path, svc string) []Rule {
		return []Rule{{Host: host, Paths: []Path{{Path: path, Backend: BackendRef{Service: svc, Port: 80}}}}}
	}
	tb := Build(Input{Ingresses: []Ingress{
		{Namespace: "a", Name: "catchall", Created: t0, Default: &BackendRef{Service: "a-default", Port: 80}},
		{Namespace: "b", Name: "shop", Created: t0.Add(time.Hour), Rules: rule("shop.b.test", "/api", "api")},
		{Namespace: "c", Name: "blog", Created: t0.Add(2 * time.Hour), Rules: rule("blog.c.test", "/", "blog"), Default: &BackendRef{Service: "c-default", Port: 80}},
		{Namespace: "c", Name: "blog-api", Created: t0.Add(3 * time.Hour), Rules: rule("api.c.test", "/v1", "api"), Default: &BackendRef{Service: "c-api-default", Port: 80}},
	}})
	for _, c := range []struct{ host, path, want string }{
		{"shop.b.test", "/checkout", ""}, // b's host, b has no default: 404, not a's default
		{"api.c.test", "/other", "c/c-api-default"},
		{"unnamed.test", "/", "a/a-default"},
	} {
		got := ""
		if r, ok := tb.Match(c.host, c.path); ok {
			got = r.Backend.Service
		}
		if got != c.want {
			t.Errorf("%s%s: went to %q, want %q", c.host, c.path, got, c.want)
		}
	}
}

// TestAnOlderWrongCertificateDoesNotHideANewerGoodOne: a certificate
// not valid for a host it is listed for is passed over for the next
// Ingress's that is.
func TestAnOlderWrongCertificateDoesNotHideANewerGoodOne(t *testing.T) {
	mk := func(names ...string) *tls.Certificate {
		return &tls.Certificate{Leaf: &x509.Certificate{DNSNames: names}}
	}
	wrong, good := mk("other.test"), mk("foo.test")
	t0 := time.Unix(1e9, 0)
	paths := []Path{{Path: "/", Backend: BackendRef{Service: "s", Port: 80}}}
	tb := Build(Input{Cert: func(ns, name string) (*tls.Certificate, error) {
		return map[string]*tls.Certificate{"wrong": wrong, "good": good}[name], nil
	},
		Ingresses: []Ingress{
			{Namespace: "a", Name: "old", Created: t0, TLS: []TLS{{Hosts: []string{"foo.test"}, Secret: "wrong"}}, Rules: []Rule{{Host: "foo.test", Paths: paths}}},
			{Namespace: "a", Name: "new", Created: t0.Add(time.Hour), TLS: []TLS{{Hosts: []string{"foo.test"}, Secret: "good"}}, Rules: []Rule{{Host: "foo.test", Paths: paths}}},
		}})
	if c := tb.Certificate("foo.test"); c != good {
		t.Errorf("SNI foo.test: %v, want the newer Ingress's valid certificate", c)
	}
}
