package ingress

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// conns is the proxy's HTTP/1.1 transport to endpoints: a request is
// written and its answer read on the calling goroutine, over a
// kept-alive connection of the endpoint's pool. net/http's Transport
// hands each request to two goroutines of its connection (a write loop
// and a read loop) and back; on a small VM those wake-ups were most of
// the proxy's added latency (go run ./test/bench -only ingress). A
// connection goes back to its pool only when its answer was read to
// the end and neither side asked to close it; anything else closes it.
type conns struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// idle are the kept-alive connections by endpoint, most recent last.
	mu   sync.Mutex
	idle map[string][]*pconn
	// maxIdle bounds each endpoint's idle connections; idleFor how long
	// one is kept.
	maxIdle int
	idleFor time.Duration
	// responseHeader bounds the wait for an answer's headers.
	responseHeader time.Duration
	swept          time.Time
}

type pconn struct {
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	used time.Time
}

// get is an idle connection to addr, or a new one.
func (t *conns) get(ctx context.Context, addr string) (*pconn, bool, error) {
	for {
		t.mu.Lock()
		l := t.idle[addr]
		if len(l) == 0 {
			t.mu.Unlock()
			break
		}
		pc := l[len(l)-1]
		t.idle[addr] = l[:len(l)-1]
		t.mu.Unlock()
		if time.Since(pc.used) < t.idleFor && pc.open() {
			return pc, true, nil
		}
		pc.c.Close()
	}
	c, err := t.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	return &pconn{c: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 16<<10)}, false, nil
}

// open reports whether the endpoint has not closed pc while it was
// idle (a read that would block: nothing came, not even an EOF), so a
// request with a body is not written to a closed connection.
func (pc *pconn) open() bool {
	if pc.br.Buffered() > 0 {
		return false // an idle connection sends nothing
	}
	sc, ok := pc.c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	// A peek that does not wait: a deadline in the past would fail
	// before looking at the socket.
	open := false
	var b [1]byte
	_ = raw.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		open = n < 0 && (err == unix.EAGAIN || err == unix.EWOULDBLOCK)
		return true
	})
	return open
}

// put keeps pc for addr's next request; the connections idle longer
// than idleFor (of endpoints gone too) are closed, at most once per
// idleFor.
func (t *conns) put(addr string, pc *pconn) {
	now := time.Now()
	pc.used = now
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.idle == nil {
		t.idle = map[string][]*pconn{}
	}
	if now.Sub(t.swept) > t.idleFor {
		t.swept = now
		for a, l := range t.idle {
			l = slices.DeleteFunc(l, func(c *pconn) bool {
				if now.Sub(c.used) > t.idleFor {
					c.c.Close()
					return true
				}
				return false
			})
			if len(l) == 0 {
				delete(t.idle, a)
			} else {
				t.idle[a] = l
			}
		}
	}
	if len(t.idle[addr]) >= t.maxIdle {
		pc.c.Close()
		return
	}
	t.idle[addr] = append(t.idle[addr], pc)
}

// closeIdle closes every idle connection.
func (t *conns) closeIdle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for addr, l := range t.idle {
		for _, pc := range l {
			pc.c.Close()
		}
		delete(t.idle, addr)
	}
}

// errStale is a kept-alive connection that the endpoint had closed
// before the request was written to it: the request is sent again on a
// new connection.
var errStale = errors.New("kept-alive connection closed by the endpoint")

// RoundTrip sends req to the endpoint its URL names and returns its answer.
// A dial error is returned as net.Dial gives it (*net.OpError, Op
// "dial"), for the retrier to try the next endpoint.
func (t *conns) RoundTrip(req *http.Request) (*http.Response, error) {
	addr := req.URL.Host
	for attempt := 0; ; attempt++ {
		pc, reused, err := t.get(req.Context(), addr)
		if err != nil {
			return nil, err
		}
		resp, err := t.exchange(req, addr, pc)
		if err == errStale && reused && attempt < 2 {
			continue
		}
		return resp, err
	}
}

// exchange writes req on pc and reads the answer's headers; the body
// reads from pc and gives it back to the pool at its end.
func (t *conns) exchange(req *http.Request, addr string, pc *pconn) (*http.Response, error) {
	ctx := req.Context()
	stop := context.AfterFunc(ctx, func() { pc.c.SetDeadline(time.Unix(1, 0)) }) // the client went away: unblock
	var rb *readErr
	if req.Body != nil {
		rb = &readErr{ReadCloser: req.Body}
		req.Body = rb
	}
	if err := req.Write(pc.bw); err != nil {
		stop()
		pc.c.Close()
		if rb != nil && rb.err != nil {
			return nil, rb.err // the client's body failed (too large, cut off): not the endpoint
		}
		return nil, err
	}
	if err := pc.bw.Flush(); err != nil {
		stop()
		pc.c.Close()
		return nil, err
	}
	if t.responseHeader > 0 {
		pc.c.SetReadDeadline(time.Now().Add(t.responseHeader))
	}
	if _, err := pc.br.Peek(1); err != nil {
		stop()
		pc.c.Close()
		if errors.Is(err, io.EOF) && req.Body == nil {
			return nil, errStale
		}
		return nil, err
	}
	resp, err := http.ReadResponse(pc.br, req)
	// Informational answers (100 Continue, 103 Early Hints) precede the
	// answer; 101 is the answer.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(pc.br, req)
	}
	if err != nil {
		stop()
		pc.c.Close()
		return nil, err
	}
	pc.c.SetReadDeadline(time.Time{})
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The connection is the body now (a WebSocket): ReverseProxy
		// copies both ways and closes it.
		stop()
		resp.Body = &upgraded{Reader: pc.br, Conn: pc.c}
		return resp, nil
	}
	keep := !resp.Close && !req.Close
	resp.Body = &body{ReadCloser: resp.Body, done: func(clean bool) {
		// stop is false once the cancel has set a deadline on pc.
		if stop() && clean && keep {
			t.put(addr, pc)
			return
		}
		pc.c.Close()
	}}
	return resp, nil
}

// readErr remembers a request body's read error.
type readErr struct {
	io.ReadCloser
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}

// body gives its connection back (done(true)) once read to its end,
// or closes it (done(false)) when closed before.
type body struct {
	io.ReadCloser
	once sync.Once
	done func(clean bool)
	eof  bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
		b.once.Do(func() { b.done(true) })
	} else if err != nil {
		b.once.Do(func() { b.done(false) })
	}
	return n, err
}

func (b *body) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.done(b.eof) })
	return err
}

// upgraded is a switched connection as a response body: reads take
// what the reader buffered first.
type upgraded struct {
	io.Reader
	net.Conn
}

func (u *upgraded) Read(p []byte) (int, error) { return u.Reader.Read(p) }
