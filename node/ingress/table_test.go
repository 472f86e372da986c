package ingress

import (
	"crypto/tls"
	"errors"
	"net/netip"
	"testing"
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
		{"shop.example.com", "/api/health", "default/web", "/api/health"},
		{"shop.example.com", "/api/health/x", "default/api", "/api"}, // Exact only
		{"blog.example.com", "/x", "default/api", "/"},               // wildcard: one label
		{"a.b.example.com", "/any", "default/empty", "/any"},         // not the wildcard: two labels
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
