package node

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
)

// Request bodies are read under deadlines, so a client that sends slowly
// (or stops) cannot hold a connection and a goroutine for long: a small
// body must arrive whole within bodyTimeout; an image upload must make
// progress at least every bodyIdleTimeout.
const (
	bodyTimeout     = 30 * time.Second
	bodyIdleTimeout = 30 * time.Second
)

// errBodyTimeout says a request body did not arrive in time.
var errBodyTimeout = errors.New("the request body did not arrive in time")

// readBody reads the whole request body, at most limit bytes, within
// bodyTimeout. Errors: a *http.MaxBytesError past limit, errBodyTimeout
// (wrapped), or the connection's.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	return readBodyWithin(w, r, limit, bodyTimeout)
}

func readBodyWithin(w http.ResponseWriter, r *http.Request, limit int64, timeout time.Duration) ([]byte, error) {
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(timeout)) // not supported by test recorders: no deadline then
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		// The rest of the body is not read: the connection closes
		// after the answer (the deadline stays, so the server's own
		// drain of the body cannot wait on a stalled client either).
		w.Header().Set("Connection", "close")
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("%w (%s)", errBodyTimeout, timeout)
		}
		return nil, err
	}
	rc.SetReadDeadline(time.Time{})
	return b, nil
}

// bodyStatus maps a readBody error to an HTTP status and a message that
// says what to do.
func bodyStatus(what string, err error) (int, error) {
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return http.StatusRequestEntityTooLarge, fmt.Errorf("%s: the request is over %s", what, humanize.IBytes(uint64(tooBig.Limit)))
	case errors.Is(err, errBodyTimeout):
		return http.StatusRequestTimeout, fmt.Errorf("%s: %w", what, err)
	}
	return http.StatusBadRequest, fmt.Errorf("%s: request body: %w", what, err)
}

// errImageTooLarge is returned by a limitedImage past its limit.
var errImageTooLarge = errors.New("the image is larger than this node accepts (agent --max-image-size)")

// limitedImage passes through at most limit bytes of an image tarball
// and fails past it; with rc set, each read must complete within
// bodyIdleTimeout (an upload that stalls is cut).
type limitedImage struct {
	r     io.Reader
	limit int64
	n     int64
	rc    *http.ResponseController
	over  bool
	// total, when set, counts the bytes of every limitedImage sharing
	// it (the blobs of one image) against limit, instead of n.
	total *atomic.Int64
}

func (l *limitedImage) Read(p []byte) (int, error) {
	if l.over {
		return 0, errImageTooLarge
	}
	n := l.n
	if l.total != nil {
		n = l.total.Load()
	}
	// Up to one byte past the limit tells a tarball of exactly limit
	// bytes from a larger one.
	if room := l.limit - n + 1; int64(len(p)) > room {
		p = p[:room]
	}
	if l.rc != nil {
		l.rc.SetReadDeadline(time.Now().Add(bodyIdleTimeout))
	}
	k, err := l.r.Read(p)
	l.n += int64(k)
	if n = l.n; l.total != nil {
		n = l.total.Add(int64(k))
	}
	if n > l.limit {
		l.over = true
		return 0, errImageTooLarge
	}
	return k, err
}

// peerImage is an image blob streamed from a peer: bounded like an
// upload, and abandoned when no data comes for bodyIdleTimeout (idle
// cancels the request; every read re-arms it).
type peerImage struct {
	limitedImage
	body   io.Closer
	idle   *time.Timer
	cancel func()
}

func (p *peerImage) Read(b []byte) (int, error) {
	p.idle.Reset(bodyIdleTimeout)
	return p.limitedImage.Read(b)
}

func (p *peerImage) Close() error {
	p.idle.Stop()
	p.cancel()
	return p.body.Close()
}
