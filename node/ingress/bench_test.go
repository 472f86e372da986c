package ingress

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

// BenchmarkIngress: GET / kept alive, one client at a time, straight to
// a backend on loopback against through the proxy (in process): the
// proxy's own cost per request. `go test -bench=Ingress ./node/ingress`.
func BenchmarkIngress(b *testing.B) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") }))
	defer backend.Close()
	p := NewProxy(slog.New(slog.DiscardHandler))
	p.Set(Build(Input{Ingresses: []Ingress{{Namespace: "a", Name: "i", Default: &BackendRef{Service: "web", Port: 80}}},
		Ports: map[string][]ServicePort{"a/web": {{Port: 80, Endpoints: []netip.AddrPort{netip.MustParseAddrPort(backend.Listener.Addr().String())}}}}}))
	front := httptest.NewServer(p.Handler(false))
	defer front.Close()
	for _, c := range []struct{ name, url string }{{"direct", backend.URL}, {"proxy", front.URL}} {
		b.Run(c.name, func(b *testing.B) {
			cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			for b.Loop() {
				resp, err := cl.Get(c.url + "/")
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
