package ingress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestTheTransportKeepsConnectionsAndReadsEveryAnswerShape: sequential
// requests share one connection to the endpoint; a connection the
// endpoint closed while idle is not used again; answers of every shape
// (chunked, HEAD, 204, 100 Continue before the answer, close-delimited)
// come through whole; a 101 hands the connection over both ways.
func TestTheTransportKeepsConnectionsAndReadsEveryAnswerShape(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/chunked":
			w.Write([]byte("a"))
			w.(http.Flusher).Flush()
			w.Write([]byte("b"))
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/body":
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "got %d", len(b))
		case "/upgrade":
			c, brw, _ := http.NewResponseController(w).Hijack()
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			line, _ := brw.ReadString('\n')
			brw.WriteString("echo " + line)
			brw.Flush()
		default:
			io.WriteString(w, "hello")
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	web := netip.MustParseAddrPort(srv.Listener.Addr().String())
	front := proxyOf(t, map[string][]ServicePort{"a/web": {{Port: 80, Endpoints: []netip.AddrPort{web}}}},
		Ingress{Namespace: "a", Name: "i", Default: &BackendRef{Service: "web", Port: 80}})
	cl := &http.Client{}
	do := func(method, path, body string, hdr ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, front.URL+path, strings.NewReader(body))
		if body == "" {
			req.Body = nil
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for range 10 {
		if code, b := do("GET", "/", ""); code != 200 || b != "hello" {
			t.Fatalf("GET /: %d %q", code, b)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("10 requests one after the other took %d connections to the endpoint, want 1", n)
	}
	for _, c := range []struct {
		method, path, body string
		hdr                []string
		code               int
		want               string
	}{
		{"GET", "/chunked", "", nil, 200, "ab"},
		{"HEAD", "/", "", nil, 200, ""},
		{"GET", "/empty", "", nil, 204, ""},
		{"POST", "/body", "12345", nil, 200, "got 5"},
		{"POST", "/body", strings.Repeat("x", 5000), []string{"Expect", "100-continue"}, 200, "got 5000"},
	} {
		if code, b := do(c.method, c.path, c.body, c.hdr...); code != c.code || b != c.want {
			t.Errorf("%s %s: %d %q, want %d %q", c.method, c.path, code, b, c.code, c.want)
		}
	}
	// The endpoint closes its idle connections: the next requests, one
	// with a body, still go through.
	srv.Config.SetKeepAlivesEnabled(false)
	srv.Config.SetKeepAlivesEnabled(true)
	time.Sleep(50 * time.Millisecond)
	if code, b := do("POST", "/body", "abc"); code != 200 || b != "got 3" {
		t.Errorf("after the endpoint closed its idle connections: %d %q", code, b)
	}
	// 101: the connection is handed over.
	c, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /upgrade HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	fmt.Fprintf(c, "ping\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := br.ReadString('\n'); err != nil || line != "echo ping\n" {
		t.Errorf("through the upgraded connection: %q %v", line, err)
	}
}
