package ingress

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

// backend is an HTTP server on loopback that names itself and echoes
// what the proxy sent it.
func backend(t *testing.T, name string) netip.AddrPort {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s host=%s xff=%s proto=%s xhost=%s real=%s len=%d", name, r.Host, r.Header.Get("X-Forwarded-For"),
			r.Header.Get("X-Forwarded-Proto"), r.Header.Get("X-Forwarded-Host"), r.Header.Get("X-Real-IP"), len(body))
	}))
	t.Cleanup(srv.Close)
	return netip.MustParseAddrPort(srv.Listener.Addr().String())
}

// deadEndpoint is a loopback port nothing listens on.
func deadEndpoint(t *testing.T) netip.AddrPort {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort(l.Addr().String())
	l.Close()
	return a
}

func proxyOf(t *testing.T, ports map[string][]ServicePort, ings ...Ingress) *httptest.Server {
	t.Helper()
	p := NewProxy(slog.New(slog.DiscardHandler))
	p.Set(Build(Input{Ingresses: ings, Ports: ports}))
	srv := httptest.NewServer(p.Handler(false))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, srv *httptest.Server, host, path string, body string) (int, string, http.Header) {
	t.Helper()
	method := http.MethodGet
	if body != "" {
		method = http.MethodPost
	}
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	req.Host = host
	req.Header.Set("X-Forwarded-For", "6.6.6.6") // a client's claim: not trusted
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestTheProxyRoutesRetriesAndRefuses(t *testing.T) {
	web, api := backend(t, "web"), backend(t, "api")
	dead := deadEndpoint(t)
	paths := func(rs ...Path) []Rule { return []Rule{{Host: "shop.test", Paths: rs}} }
	srv := proxyOf(t, map[string][]ServicePort{
		"shop/web":   {{Port: 80, Endpoints: []netip.AddrPort{dead, web}}},
		"shop/api":   {{Port: 80, Endpoints: []netip.AddrPort{api}}},
		"shop/empty": {{Port: 80}},
	}, Ingress{Namespace: "shop", Name: "front", BodyBytes: 100, TLS: []TLS{{Hosts: []string{"secure.test"}, Secret: "x"}},
		Rules: append(paths(
			Path{Path: "/", Backend: BackendRef{Service: "web", Port: 80}},
			Path{Path: "/api", Backend: BackendRef{Service: "api", Port: 80}},
			Path{Path: "/empty", Backend: BackendRef{Service: "empty", Port: 80}},
			Path{Path: "/noport", Backend: BackendRef{Service: "web", Port: 81}},
		), Rule{Host: "secure.test", Paths: []Path{{Path: "/", Backend: BackendRef{Service: "web", Port: 80}}}})})

	// Every request reaches web, though one of its two endpoints is
	// dead: a failed connect is tried on the next.
	for i := range 4 {
		code, body, _ := get(t, srv, "shop.test", "/cart", "")
		if code != 200 || !strings.HasPrefix(body, "web host=shop.test xff=127.0.0.1 proto=http xhost=shop.test real=127.0.0.1") {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	if code, body, _ := get(t, srv, "shop.test:80", "/api/v1", "hello"); code != 200 || !strings.HasPrefix(body, "api ") || !strings.HasSuffix(body, "len=5") {
		t.Errorf("/api/v1: %d %q", code, body)
	}
	for _, c := range []struct {
		host, path, body string
		code             int
		says             string
	}{
		{"shop.test", "/empty", "", 503, "no ready endpoint serves this path"},
		{"shop.test", "/noport", "", 503, "no ready endpoint serves this path"},
		{"shop.test", "/api/../admin", "", 400, "'..' segments"},
		{"shop.test", "/api/%2e%2e/admin", "", 400, "'..' segments"},
		{"shop.test", "/api//x", "", 400, "'//'"},
		{"shop.test", "/api/..;/manager", "", 400, "'..' segments"},
		{"shop.test", "/api/.;x=1/v1", "", 400, "'..' segments"},
		{"nobody.test", "/", "", 404, `no Ingress rule matches host "nobody.test"`},
		{"shop.test", "/", strings.Repeat("x", 101), 413, "bound of 100"},
		{"secure.test", "/a?b=c", "", 308, ""},
	} {
		code, body, hdr := get(t, srv, c.host, c.path, c.body)
		if code != c.code || !strings.Contains(body, c.says) {
			t.Errorf("%s%s: %d %q, want %d %q", c.host, c.path, code, body, c.code, c.says)
		}
		if c.code == 308 && hdr.Get("Location") != "https://secure.test/a?b=c" {
			t.Errorf("redirect to %q", hdr.Get("Location"))
		}
	}
}

func TestAChunkedBodyOverTheBoundIs413(t *testing.T) {
	web := backend(t, "web")
	srv := proxyOf(t, map[string][]ServicePort{"a/web": {{Port: 80, Endpoints: []netip.AddrPort{web}}}},
		Ingress{Namespace: "a", Name: "i", BodyBytes: 10, Default: &BackendRef{Service: "web", Port: 80}})
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n14\r\n%s\r\n0\r\n\r\n", strings.Repeat("y", 20))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 413 {
		t.Errorf("status %d, want 413", resp.StatusCode)
	}
}
