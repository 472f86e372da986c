package apiserver

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestSlowRequestBodyIsCut: a client that sends headers and then trickles
// (or stops) its body gets 408 once the body timeout passes, instead of
// holding the connection.
func TestSlowRequestBodyIsCut(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := readBodyWithin(w, r, 1<<20, 300*time.Millisecond); err != nil {
			WriteError(w, bodyError("apply", err))
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
