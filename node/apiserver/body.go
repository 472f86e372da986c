package apiserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/starling-orchestrator/starling/node/api"
)

// Request bodies are read under deadlines, so a client that sends slowly
// (or stops) cannot hold a connection and a goroutine for long: a small
// body must arrive whole within BodyTimeout; an image upload must make
// progress at least every IdleTimeout.
const (
	BodyTimeout = 30 * time.Second
	IdleTimeout = 30 * time.Second
)

// errBodyTimeout says a request body did not arrive in time.
var errBodyTimeout = errors.New("the request body did not arrive in time")

func writeBody(w io.Writer, v any) { json.NewEncoder(w).Encode(v) }

// ReadBody reads the whole request body, at most limit bytes, within
// BodyTimeout. The error is an api error saying what to do: 413 past
// limit (wrapping *http.MaxBytesError), 408 when the body did not arrive
// in time, 400 otherwise; what names the request in it.
func ReadBody(w http.ResponseWriter, r *http.Request, what string, limit int64) ([]byte, error) {
	b, err := readBodyWithin(w, r, limit, BodyTimeout)
	if err != nil {
		return nil, bodyError(what, err)
	}
	return b, nil
}

// ReadJSON reads a JSON body (ReadBody) into v; an empty body leaves v
// as it is. A body that does not decode is a 400.
func ReadJSON(w http.ResponseWriter, r *http.Request, what string, limit int64, v any) error {
	b, err := ReadBody(w, r, what, limit)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return api.Errorf(http.StatusBadRequest, "%s: request body: %v", what, err)
	}
	return nil
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

// bodyError maps a body read error to an api error that says what to do.
func bodyError(what string, err error) error {
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return api.Errorf(http.StatusRequestEntityTooLarge, "%s: the request is over %s", what, humanize.IBytes(uint64(tooBig.Limit)))
	case errors.Is(err, errBodyTimeout):
		return api.Errorf(http.StatusRequestTimeout, "%s: %v", what, err)
	}
	return api.Errorf(http.StatusBadRequest, "%s: request body: %v", what, err)
}

// ErrTooLarge is returned by a Limited reader past its limit.
var ErrTooLarge = errors.New("the image is larger than this node accepts (agent --max-image-size)")

// Limited passes through at most Limit bytes of an image tarball or of
// the blobs of one image, and fails with ErrTooLarge past it; with RC
// set, each read must complete within IdleTimeout (an upload that stalls
// is cut).
type Limited struct {
	R     io.Reader
	Limit int64
	RC    *http.ResponseController
	// Total, when set, counts the bytes of every Limited sharing it (the
	// blobs of one image) against Limit.
	Total *atomic.Int64

	n    int64
	over bool
}

// Over reports whether the reader went past its limit.
func (l *Limited) Over() bool { return l.over }

func (l *Limited) Read(p []byte) (int, error) {
	if l.over {
		return 0, ErrTooLarge
	}
	n := l.n
	if l.Total != nil {
		n = l.Total.Load()
	}
	// Up to one byte past the limit tells a tarball of exactly limit
	// bytes from a larger one.
	if room := l.Limit - n + 1; int64(len(p)) > room {
		p = p[:room]
	}
	if l.RC != nil {
		l.RC.SetReadDeadline(time.Now().Add(IdleTimeout))
	}
	k, err := l.R.Read(p)
	l.n += int64(k)
	if n = l.n; l.Total != nil {
		n = l.Total.Add(int64(k))
	}
	if n > l.Limit {
		l.over = true
		return 0, ErrTooLarge
	}
	return k, err
}

// importImages streams an image tarball into the store, bounded by
// MaxImageBytes and IdleTimeout.
func (s *server) importImages(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	body := &Limited{R: r.Body, Limit: s.b.MaxImageBytes, RC: rc}
	imgs, err := s.b.Images.Import(r.Context(), body)
	if err != nil || body.over {
		// The connection closes after the answer, with the idle
		// deadline left in place: nothing waits on the rest.
		w.Header().Set("Connection", "close")
	} else {
		rc.SetReadDeadline(time.Time{})
	}
	switch {
	case body.over:
		WriteError(w, api.Errorf(http.StatusRequestEntityTooLarge, "image import: the tarball is over %s, the limit of node %s (agent --max-image-size)",
			humanize.IBytes(uint64(s.b.MaxImageBytes)), s.b.Node))
	case errors.Is(err, os.ErrDeadlineExceeded):
		WriteError(w, api.Errorf(http.StatusRequestTimeout, "image import: no data for %s; the upload was cut", IdleTimeout))
	case err != nil:
		var st apierrors.APIStatus
		if !errors.As(err, &st) {
			err = api.NewError(http.StatusBadRequest, err) // the tarball's fault
		}
		WriteError(w, err)
	default:
		WriteJSON(w, http.StatusOK, api.ImageList{Items: nonNil(imgs)})
	}
}
