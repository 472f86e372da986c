package ingress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Limits and timeouts of the proxy, ingress-nginx's defaults where it
// has one.
const (
	// ConnectTimeout bounds one connect to an endpoint
	// (proxy-connect-timeout 5 s); a failed connect is retried on the
	// next endpoint.
	ConnectTimeout = 5 * time.Second
	// ResponseHeaderTimeout bounds the wait for a backend's answer
	// (proxy-read-timeout 60 s).
	ResponseHeaderTimeout = 60 * time.Second
	// ReadHeaderTimeout bounds a client's request line and headers (a
	// slowloris holds a connection no longer), BodyIdleTimeout the wait
	// for each read of its body (client-body-timeout 60 s).
	ReadHeaderTimeout = 10 * time.Second
	BodyIdleTimeout   = 60 * time.Second
	// IdleTimeout closes a kept-alive client connection that sends no
	// request.
	IdleTimeout = 120 * time.Second
	// MaxHeaderBytes bounds a request's headers; MaxConnections the
	// client connections of each listener (more wait to be accepted).
	MaxHeaderBytes = 64 << 10
	MaxConnections = 4096
	// downFor is how long an endpoint that refused a connect is tried
	// last (passive health checking, as nginx's max_fails/fail_timeout).
	downFor = 10 * time.Second
	// maxAttempts bounds the endpoints one request tries.
	maxAttempts = 3
)

// Proxy serves requests by the latest table it was given (Set). A new
// table changes where new requests go; requests and upgraded
// connections under way (a WebSocket) keep theirs, and a new certificate
// is presented from the next handshake on.
type Proxy struct {
	table atomic.Pointer[Table]
	down  sync.Map // netip.AddrPort -> time.Time it counts as up again
	rp    *httputil.ReverseProxy
	tr    *conns
	// fallback is presented to a client whose SNI names no host with a
	// certificate (as ingress-nginx's fake certificate).
	fallback *tls.Certificate
	log      *slog.Logger
	// HTTPSPort is the port redirects to HTTPS name (443: none named;
	// 0: the node serves no HTTPS, and nothing is redirected).
	HTTPSPort int
}

// challengePath is where ACME servers ask for HTTP-01 tokens.
const challengePath = "/.well-known/acme-challenge/"

// attemptKey carries a request's endpoints, in the order to try them,
// to the transport's dial.
type attemptKey struct{}

// NewProxy returns a proxy with an empty table (every request 404).
func NewProxy(log *slog.Logger) *Proxy {
	p := &Proxy{fallback: selfSigned(), log: log, HTTPSPort: 443}
	p.table.Store(Build(Input{}))
	p.tr = &conns{dial: (&net.Dialer{Timeout: ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		maxIdle: 64, idleFor: 30 * time.Second, responseHeader: ResponseHeaderTimeout}
	p.rp = &httputil.ReverseProxy{
		Rewrite:      p.rewrite,
		Transport:    retrier{p},
		BufferPool:   &buffers{}, // not 32 KiB allocated per request
		ErrorHandler: p.fail,
		// FlushInterval 0: an answer of known length goes out in one
		// write; a stream (no length, or text/event-stream) is flushed
		// as it comes (httputil.ReverseProxy does that by itself).
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return p
}

// Set makes t the table new requests are routed by.
func (p *Proxy) Set(t *Table) { p.table.Store(t) }

// Table is the table requests are routed by.
func (p *Proxy) Table() *Table { return p.table.Load() }

// TLSConfig is the HTTPS listener's: the certificate the table gives
// for the client's SNI, read at each handshake; HTTP/2 and HTTP/1.1.
func (p *Proxy) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if c := p.table.Load().Certificate(hello.ServerName); c != nil {
				return c, nil
			}
			return p.fallback, nil
		},
	}
}

// Handler serves requests that arrived over TLS (secure) or plain HTTP.
func (p *Proxy) Handler(secure bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.serve(w, r, secure) })
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, secure bool) {
	host := hostOnly(r.Host)
	if !cleanPath(r.URL.Path) {
		// "/api/../admin" would match /api and reach /admin: such
		// paths are refused, not routed (nginx matches on the
		// normalised path; refusing is simpler and as safe).
		http.Error(w, "400 the path has '.' or '..' segments or '//'\n", http.StatusBadRequest)
		return
	}
	t := p.table.Load()
	if token, ok := strings.CutPrefix(r.URL.Path, challengePath); ok && r.Method == http.MethodGet {
		// ACME HTTP-01 (RFC 8555, 8.3): the key authorization of a
		// challenge the cluster has under way, answered by every node,
		// never redirected; any other token goes to the routes.
		if ka, ok := t.Challenge(token); ok {
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = io.WriteString(w, ka)
			return
		}
	}
	rt, ok := t.Match(host, r.URL.Path)
	switch {
	case !ok:
		http.Error(w, fmt.Sprintf("404 no Ingress rule matches host %q and path %q\n", host, r.URL.Path), http.StatusNotFound)
		return
	case !secure && rt.Redirect && p.HTTPSPort != 0:
		target := "https://" + host
		if p.HTTPSPort != 443 {
			target += fmt.Sprintf(":%d", p.HTTPSPort)
		}
		http.Redirect(w, r, target+r.URL.RequestURI(), http.StatusPermanentRedirect)
		return
	case !rt.Backend.Found || len(rt.Backend.Endpoints) == 0:
		// The client is told no names of the cluster's; 'starling
		// describe ingress' shows which backend has no endpoint.
		http.Error(w, "503 Service Unavailable: no ready endpoint serves this path\n", http.StatusServiceUnavailable)
		return
	}
	if rt.BodyBytes > 0 {
		if r.ContentLength > rt.BodyBytes {
			http.Error(w, fmt.Sprintf("413 request body of %d bytes is over this Ingress's bound of %d (annotation %s)\n", r.ContentLength, rt.BodyBytes, "nginx.ingress.kubernetes.io/proxy-body-size"),
				http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, rt.BodyBytes)
	}
	if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody && !isUpgrade(r) {
		r.Body = &idleBody{ReadCloser: r.Body, rc: http.NewResponseController(w)}
	}
	order := p.order(rt.Backend)
	ctx := context.WithValue(r.Context(), attemptKey{}, order)
	if !isUpgrade(r) {
		iw := &idleWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
		// The deadline must not outlive the answer: the next request on
		// a kept-alive connection may come much later.
		defer func() { _ = iw.rc.SetWriteDeadline(time.Time{}) }()
		w = iw
	}
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// order is b's endpoints in the order a request tries them: round
// robin, the endpoints that recently refused a connect last.
func (p *Proxy) order(b *Backend) []netip.AddrPort {
	eps := b.Endpoints
	n := len(eps)
	start := int(b.next.Add(1) % uint64(n))
	out := make([]netip.AddrPort, 0, n)
	var later []netip.AddrPort
	now := time.Now()
	for i := range n {
		ep := eps[(start+i)%n]
		if until, ok := p.down.Load(ep); ok {
			if now.Before(until.(time.Time)) {
				later = append(later, ep)
				continue
			}
			p.down.Delete(ep)
		}
		out = append(out, ep)
	}
	return append(out, later...)
}

// rewrite sends the request to its first endpoint, with the client's
// Host and X-Forwarded-For/-Host/-Proto and X-Real-IP set (any the
// client sent are replaced: they are not trusted).
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "endpoint" // the retrier names it

	pr.Out.Host = pr.In.Host
	pr.SetXForwarded()
	if ip, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
		pr.Out.Header.Set("X-Real-IP", ip)
	}
}

// retrier sends a request to its endpoints in order until one accepts
// the connection: a connect that fails is retried on the next (at most
// maxAttempts), before a byte of the request is sent, so any request may
// be retried. Each attempt names its endpoint, so the transport pools
// each connection under the endpoint it goes to.
type retrier struct{ p *Proxy }

func (rt retrier) RoundTrip(req *http.Request) (*http.Response, error) {
	order, _ := req.Context().Value(attemptKey{}).([]netip.AddrPort)
	if len(order) == 0 {
		return nil, errors.New("no endpoint to send the request to")
	}
	body := req.Body
	if body != nil {
		// The transport closes the body when a connect fails; it is
		// unread then, and the next attempt sends it.
		req.Body = keepOpen{body}
		defer body.Close()
	}
	var errs []error
	for i, ep := range order {
		if i == maxAttempts {
			break
		}
		// The proxy's own copy (cloned by httputil.ReverseProxy): only the URL's
		// host differs between attempts.
		out, u := *req, *req.URL
		u.Host, out.URL = ep.String(), &u
		resp, err := rt.p.tr.RoundTrip(&out)
		if err == nil {
			rt.p.down.Delete(ep)
			return resp, nil
		}
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" || req.Context().Err() != nil {
			return nil, err
		}
		rt.p.down.Store(ep, time.Now().Add(downFor))
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// keepOpen is a request body the transport cannot close.
type keepOpen struct{ io.ReadCloser }

func (keepOpen) Close() error { return nil }

// fail answers a request the proxy could not complete: 413 for a body
// over its bound, 504 when the backend did not answer in time, 502
// otherwise (every endpoint tried refused, or the backend broke off).
func (p *Proxy) fail(w http.ResponseWriter, r *http.Request, err error) {
	var tooBig *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooBig):
		http.Error(w, fmt.Sprintf("413 request body is over this Ingress's bound of %d bytes\n", tooBig.Limit), http.StatusRequestEntityTooLarge)
	case r.Context().Err() != nil:
		// The client went away: nobody reads an answer.
	case errors.As(err, &ne) && ne.Timeout():
		http.Error(w, "504 the backend did not answer in time\n", http.StatusGatewayTimeout)
	default:
		// What failed names endpoints' addresses: the node's log has
		// it, the client is told no more than that.
		p.log.Info("ingress: backend failed", "host", r.Host, "path", r.URL.Path, "err", oneLine(err.Error()))
		http.Error(w, "502 bad gateway: no endpoint of the backend answered\n", http.StatusBadGateway)
	}
}

// idleBody bounds the wait for each read of a request body
// (BodyIdleTimeout): a client that trickles its body is cut off, one
// that sends steadily is not. The deadline is lifted once the body
// ends, so a long answer is not cut by it.
type idleBody struct {
	io.ReadCloser
	rc *http.ResponseController
}

func (b *idleBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(BodyIdleTimeout))
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// buffers are the copy buffers of answers' bodies
// (httputil.BufferPool), reused across requests.
type buffers struct{ p sync.Pool }

func (b *buffers) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *buffers) Put(buf []byte) { b.p.Put(&buf) }

// idleWriter bounds the wait for each write to the client
// (BodyIdleTimeout): a client that reads an answer 1 byte a minute is
// cut off, one that reads steadily is not (nginx's send_timeout).
type idleWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (w *idleWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(BodyIdleTimeout))
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection (flushes).
func (w *idleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// isUpgrade reports whether r asks to switch protocols (a WebSocket):
// its connection is handed over, and no deadline may cut it.
func isUpgrade(r *http.Request) bool {
	return r.Header.Get("Upgrade") != "" && strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade")
}

// cleanPath reports whether p has no "." or ".." segment and no empty
// one ("//"); a segment's path parameters (";jsessionid=1") do not
// hide one: Tomcat reads "/api/..;/manager" as "/manager".
func cleanPath(p string) bool {
	for _, seg := range strings.Split(p, "/")[1:] {
		if seg, _, _ = strings.Cut(seg, ";"); seg == "." || seg == ".." {
			return false
		}
	}
	return !strings.Contains(p, "//")
}

// hostOnly is a Host header without its port.
func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return strings.Trim(h, "[]")
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", "; ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
