package node

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestImageImportOverTheCapIsRefused: a tarball over --max-image-size is
// cut off while it streams and refused with 413 naming the limit; one at
// the limit goes through.
func TestImageImportOverTheCapIsRefused(t *testing.T) {
	n := start(t, "a0", t.TempDir(), nil, func(c *Config) { c.MaxImageBytes = 4096 })
	post := func(size int) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		n.agent.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/images", bytes.NewReader(make([]byte, size))))
		return rec
	}
	if rec := post(4096); rec.Code != http.StatusOK {
		t.Fatalf("a tarball at the limit: %d %s", rec.Code, rec.Body)
	}
	rec := post(100_000)
	if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(rec.Body.String(), "over 4.0 KiB") || !strings.Contains(rec.Body.String(), "--max-image-size") {
		t.Fatalf("a tarball over the limit: %d %s", rec.Code, rec.Body)
	}
}

// TestSlowRequestBodyIsCut: a client that sends headers and then trickles
// (or stops) its body gets 408 once the body timeout passes, instead of
// holding the connection.
func TestSlowRequestBodyIsCut(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := readBodyWithin(w, r, 1<<20, 300*time.Millisecond); err != nil {
			status, err := bodyStatus("apply", err)
			writeError(w, status, err)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /v1/apply HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestTimeout || time.Since(start) > 5*time.Second {
		t.Fatalf("status %d after %s, want 408 after about 300ms", resp.StatusCode, time.Since(start))
	}
}
