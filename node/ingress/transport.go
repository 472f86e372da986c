package ingress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
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
	lim  *limited
	used time.Time
	// dead: the request's context ended and the connection's deadline
	// is in the past; no later deadline may lift it (mu).
	mu   sync.Mutex
	dead bool
	// broken: writing the request failed; the answer is waited for
	// only briefly (an endpoint that answered early, 413, is heard).
	broken bool
	// answered: the answer's headers came; no bound on waiting for
	// them may be set any more.
	answered bool
}

func newPconn(c net.Conn) *pconn {
	pc := &pconn{c: c, lim: &limited{r: c, left: -1}}
	pc.br = bufio.NewReaderSize(pc.lim, 16<<10)
	pc.bw = bufio.NewWriterSize(writeIdle{pc}, 16<<10)
	return pc
}

// kill makes every read and write of pc fail now (the client went
// away), for good.
func (pc *pconn) kill() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.dead = true
	_ = pc.c.SetDeadline(time.Unix(1, 0))
}

// writeFailed is what the request's writer does when it fails: what
// the endpoint already answered is read, nothing more is waited for.
func (pc *pconn) writeFailed() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.broken = true
	if !pc.dead && !pc.answered {
		_ = pc.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	}
}

// awaitBy sets the deadline for the answer's headers, unless the
// request could not be written, they came already or pc was killed.
func (pc *pconn) awaitBy(t time.Time) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if !pc.dead && !pc.broken && !pc.answered {
		_ = pc.c.SetReadDeadline(t)
	}
}

// exchanging readies pc for a request (a pooled connection's flags
// are its last request's).
func (pc *pconn) exchanging() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.broken, pc.answered = false, false
}

// gotAnswer lifts the bound on the answer's headers: they came.
func (pc *pconn) gotAnswer() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.answered = true
	if !pc.dead {
		_ = pc.c.SetReadDeadline(time.Time{})
	}
}

// readBy and writeBy set pc's deadlines, unless it was killed.
func (pc *pconn) readBy(t time.Time) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if !pc.dead {
		_ = pc.c.SetReadDeadline(t)
	}
}

func (pc *pconn) writeBy(t time.Time) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if !pc.dead {
		_ = pc.c.SetWriteDeadline(t)
	}
}

// writeIdle bounds each write to the endpoint (an endpoint that stops
// reading a request's body holds nothing longer).
type writeIdle struct{ pc *pconn }

func (w writeIdle) Write(p []byte) (int, error) {
	w.pc.writeBy(time.Now().Add(ioIdle))
	return w.pc.c.Write(p)
}

// limited bounds what the connection may give while an answer's
// headers are read (left; -1: no bound), as net/http bounds them.
type limited struct {
	r    io.Reader
	left int64
}

var errHeadersTooLarge = errors.New("the endpoint's answer headers are over 1 MiB")

func (l *limited) Read(p []byte) (int, error) {
	if l.left == 0 {
		return 0, errHeadersTooLarge
	}
	if l.left > 0 && int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	if l.left > 0 {
		l.left -= int64(n)
	}
	return n, err
}

// Bounds of an exchange with an endpoint: maxHeaderBytes of answer
// headers (all informational answers included, at most max1xx of
// them), ioIdle between reads and between writes once the answer's
// headers came (nginx's proxy_read_timeout and proxy_send_timeout).
const (
	maxHeaderBytes = 1 << 20
	max1xx         = 8
)

var ioIdle = 60 * time.Second // a var: tests shorten it

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
	return newPconn(c), false, nil
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

// errStale is a kept-alive connection that the endpoint had closed
// (or reset) before it answered a bodiless request: an idempotent one
// is sent again on a new connection.
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
		if errors.Is(err, errStale) && reused && attempt < 2 && req.Body == nil &&
			slices.Contains([]string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace}, req.Method) {
			continue
		}
		return resp, err
	}
}

// exchange writes req on pc and reads the answer's headers; the body
// reads from pc and gives it back to the pool at its end. A request
// body is written on a goroutine of its own while the answer is read,
// as net/http does: an endpoint may answer (413, 401) before it read
// the body, and that answer is the one passed on.
func (t *conns) exchange(req *http.Request, addr string, pc *pconn) (*http.Response, error) {
	pc.exchanging()
	ctx := req.Context()
	stop := context.AfterFunc(ctx, pc.kill) // the client went away: unblock
	fail := func(err error) (*http.Response, error) {
		stop()
		pc.c.Close()
		return nil, err
	}
	write := func() error {
		if err := req.Write(pc.bw); err != nil {
			return err
		}
		if err := pc.bw.Flush(); err != nil {
			return err
		}
		// The answer is waited for from when the request is written
		// (net/http's ResponseHeaderTimeout): an upload that takes
		// longer is not cut off by it.
		if t.responseHeader > 0 {
			pc.awaitBy(time.Now().Add(t.responseHeader))
		}
		return nil
	}
	wrote := make(chan error, 1)
	var rb *readErr
	if req.Body == nil {
		if err := write(); err != nil {
			// Nothing was answered: on a kept-alive connection, the
			// endpoint closed it (RoundTrip sends an idempotent request
			// again).
			return fail(fmt.Errorf("%w: %w", errStale, err))
		}
		wrote <- nil
	} else {
		rb = &readErr{ReadCloser: req.Body}
		req.Body = rb
		go func() {
			err := write()
			if err != nil {
				pc.writeFailed()
			}
			wrote <- err
		}()
	}
	pc.lim.left = maxHeaderBytes
	if _, err := pc.br.Peek(1); err != nil {
		if (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) && req.Body == nil {
			stop()
			pc.c.Close()
			return nil, errStale
		}
		return fail(t.blame(rb, wrote, err))
	}
	resp, err := http.ReadResponse(pc.br, req)
	// Informational answers (100 Continue, 103 Early Hints) precede the
	// answer; 101 is the answer.
	for i := 0; err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols; i++ {
		if i == max1xx {
			err = fmt.Errorf("the endpoint sent more than %d informational answers", max1xx)
			break
		}
		resp, err = http.ReadResponse(pc.br, req)
	}
	pc.lim.left = -1
	if err != nil {
		return fail(t.blame(rb, wrote, err))
	}
	pc.gotAnswer()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The connection is the body now (a WebSocket): ReverseProxy
		// copies both ways and closes it. Only the protocol the request
		// asked for is taken (httputil would answer 502 to another
		// and leave the connection open).
		if want, got := upgradeType(req.Header), upgradeType(resp.Header); want == "" || !strings.EqualFold(want, got) {
			return fail(fmt.Errorf("the endpoint switched to protocol %q; the request asked for %q", got, want))
		}
		// Its writes are bounded by nothing now: the request's write
		// deadline would cut a quiet WebSocket off.
		pc.writeBy(time.Time{})
		stop()
		resp.Body = &upgraded{Reader: pc.br, Conn: pc.c}
		return resp, nil
	}
	keep := !resp.Close && !req.Close
	resp.Body = &body{ReadCloser: resp.Body, pc: pc, done: func(clean bool) {
		var werr error = errors.New("the request body is still being written")
		select {
		case werr = <-wrote:
		default:
		}
		// stop is false once the cancel has set a deadline on pc.
		if stop() && clean && keep && werr == nil {
			t.put(addr, pc)
			return
		}
		pc.c.Close()
	}}
	return resp, nil
}

// upgradeType is the protocol h asks to switch to ("" if none), as
// httputil.ReverseProxy reads it.
func upgradeType(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

// blame is the error to give for an exchange that failed with err: the
// client's body's own failure (too large, cut off) if that is what
// broke the write, else err.
func (t *conns) blame(rb *readErr, wrote chan error, err error) error {
	if rb == nil {
		return err
	}
	select {
	case werr := <-wrote:
		wrote <- werr
		if rb.failed() != nil {
			return rb.failed()
		}
	case <-time.After(100 * time.Millisecond):
	}
	return err
}

// readErr remembers a request body's read error (read on the write
// goroutine, asked for on the caller's).
type readErr struct {
	io.ReadCloser
	mu  sync.Mutex
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
	}
	return n, err
}

func (r *readErr) failed() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// body gives its connection back (done(true)) once read to its end,
// or closes it (done(false)) when closed before.
type body struct {
	io.ReadCloser
	pc   *pconn
	once sync.Once
	done func(clean bool)
	eof  bool
}

func (b *body) Read(p []byte) (int, error) {
	b.pc.readBy(time.Now().Add(ioIdle)) // an endpoint that stalls mid-answer is cut off
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
