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

// rawBackend serves each connection with handle, on loopback.
func rawBackend(t *testing.T, handle func(c net.Conn)) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); handle(c) }()
		}
	}()
	return netip.MustParseAddrPort(l.Addr().String())
}

// TestTheTransportHearsEarlyAnswersAndRefusesWhatNetHTTPRefuses: an
// endpoint that answers 413 before reading a large body is heard (not a
// 502); answer headers over 1 MiB are refused; a POST whose kept-alive
// connection the endpoint closed without answering is not sent twice.
func TestTheTransportHearsEarlyAnswersAndRefusesWhatNetHTTPRefuses(t *testing.T) {
	early := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big\n")
	})
	huge := rawBackend(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		for i := 0; i < 200000; i++ {
			fmt.Fprintf(c, "X-H%d: v\r\n", i)
		}
		io.WriteString(c, "\r\n")
	})
	var posts atomic.Int32
	once := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			if req.Method == http.MethodPost {
				posts.Add(1)
				return // read it, closed without a word
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	ports := map[string][]ServicePort{
		"a/early": {{Port: 80, Endpoints: []netip.AddrPort{early}}},
		"a/huge":  {{Port: 80, Endpoints: []netip.AddrPort{huge}}},
		"a/once":  {{Port: 80, Endpoints: []netip.AddrPort{once}}},
	}
	path := func(p, svc string) Path { return Path{Path: p, Backend: BackendRef{Service: svc, Port: 80}} }
	front := proxyOf(t, ports, Ingress{Namespace: "a", Name: "i", Rules: []Rule{{Paths: []Path{path("/early", "early"), path("/huge", "huge"), path("/once", "once")}}}})
	resp, err := http.Post(front.URL+"/early", "application/octet-stream", strings.NewReader(strings.Repeat("x", 900<<10)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 413 || string(b) != "too big\n" {
		t.Errorf("an early answer: %d %q, want the endpoint's 413", resp.StatusCode, b)
	}
	if resp, err := http.Get(front.URL + "/huge"); err != nil || resp.StatusCode != http.StatusBadGateway {
		t.Errorf("answer headers over 1 MiB: %v %v, want 502", resp, err)
	}
	cl := &http.Client{}
	if resp, err := cl.Get(front.URL + "/once"); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	req, _ := http.NewRequest(http.MethodPost, front.URL+"/once", nil)
	if resp, err := cl.Do(req); err == nil {
		resp.Body.Close()
	}
	if n := posts.Load(); n != 1 {
		t.Errorf("a POST the endpoint read and closed on reached it %d times, want 1", n)
	}
}

// TestAnUploadIsNotCutByTheWaitForTheAnswer: the bound on the wait for
// an answer's headers starts once the request is written, so an upload
// that takes longer than the bound, sent steadily, goes through.
func TestAnUploadIsNotCutByTheWaitForTheAnswer(t *testing.T) {
	ep := rawBackend(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		n, _ := io.Copy(io.Discard, req.Body)
		s := fmt.Sprint(n)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(s), s)
	})
	tr := &conns{dial: (&net.Dialer{}).DialContext, maxIdle: 4, idleFor: 30 * time.Second, responseHeader: 300 * time.Millisecond}
	pr, pw := io.Pipe()
	go func() { // 1 s of upload, a chunk every 100 ms
		for range 10 {
			pw.Write(make([]byte, 1000))
			time.Sleep(100 * time.Millisecond)
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, "http://"+ep.String()+"/up", pr)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("a 1 s upload with a 300 ms bound on the answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "10000" {
		t.Errorf("the endpoint read %q bytes, want 10000", b)
	}
	// The bound still holds once the request is written.
	silent := rawBackend(t, func(c net.Conn) {
		http.ReadRequest(bufio.NewReader(c))
		time.Sleep(2 * time.Second)
	})
	req, _ = http.NewRequest(http.MethodGet, "http://"+silent.String()+"/", nil)
	start := time.Now()
	if _, err := tr.RoundTrip(req); err == nil || time.Since(start) > 1500*time.Millisecond {
		t.Errorf("an endpoint that does not answer: %v after %v, want a timeout after 300 ms", err, time.Since(start))
	}
}

// TestAWebSocketOutlivesTheIdleBoundsAndAWrongSwitchIsClosed: an
// upgraded connection quiet for longer than the bound on each write of
// a request still carries messages both ways; an endpoint that switches
// to another protocol than the one asked for gets its connection
// closed (and the client 502).
func TestAWebSocketOutlivesTheIdleBoundsAndAWrongSwitchIsClosed(t *testing.T) {
	defer func(d time.Duration) { ioIdle = d }(ioIdle)
	ioIdle = 300 * time.Millisecond
	switched := func(proto string, closed chan<- bool) netip.AddrPort {
		return rawBackend(t, func(c net.Conn) {
			br := bufio.NewReader(c)
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", proto)
			if closed != nil {
				c.SetReadDeadline(time.Now().Add(3 * time.Second))
				_, err := br.ReadByte()
				ne, ok := err.(net.Error)
				closed <- !(ok && ne.Timeout())
				return
			}
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				io.WriteString(c, "echo "+line)
			}
		})
	}
	closed := make(chan bool, 1)
	front := proxyOf(t, map[string][]ServicePort{
		"a/ws":    {{Port: 80, Endpoints: []netip.AddrPort{switched("echo", nil)}}},
		"a/wrong": {{Port: 80, Endpoints: []netip.AddrPort{switched("other", closed)}}},
	}, Ingress{Namespace: "a", Name: "i", Rules: []Rule{{Paths: []Path{
		{Path: "/ws", Backend: BackendRef{Service: "ws", Port: 80}},
		{Path: "/wrong", Backend: BackendRef{Service: "wrong", Port: 80}}}}}})
	upgrade := func(path string) (net.Conn, *bufio.Reader, *http.Response) {
		c, err := net.Dial("tcp", front.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", path)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c, br, resp
	}
	c, br, resp := upgrade("/ws")
	if resp.StatusCode != 101 {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	for i, wait := range []time.Duration{0, 1 * time.Second} {
		time.Sleep(wait)
		fmt.Fprintf(c, "ping%d\n", i)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if line, err := br.ReadString('\n'); err != nil || line != fmt.Sprintf("echo ping%d\n", i) {
			t.Fatalf("message %d, %v after the last: %q %v", i, wait, line, err)
		}
	}
	if _, _, resp := upgrade("/wrong"); resp.StatusCode != http.StatusBadGateway {
		t.Errorf("a switch to another protocol: %s, want 502", resp.Status)
	}
	if !<-closed {
		t.Error("the endpoint that switched to another protocol still has its connection 3 s later")
	}
}

// TestAGETOnAConnectionTheEndpointResetIsSentAgain: an endpoint that
// resets a kept-alive connection on receiving a request, unanswered,
// does not cost an idempotent request a 502.
func TestAGETOnAConnectionTheEndpointResetIsSentAgain(t *testing.T) {
	var dialed atomic.Int32
	ep := rawBackend(t, func(c net.Conn) {
		first := dialed.Add(1) == 1
		br := bufio.NewReader(c)
		for i := 0; ; i++ {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			if first && i == 1 {
				c.(*net.TCPConn).SetLinger(0) // an RST, not a FIN
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := &conns{dial: (&net.Dialer{}).DialContext, maxIdle: 4, idleFor: 30 * time.Second}
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodGet, "http://"+ep.String()+"/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if n := dialed.Load(); n != 2 {
		t.Errorf("%d connections, want 2 (the reset one and its replacement)", n)
	}
}
