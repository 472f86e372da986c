package runtime

import (
	"io"
	"strings"
	"testing"
	"time"
)

// A replica waiting on an image says where it comes from and how far the
// transfer is, then that it is being unpacked, then nothing.
func TestImageProgressNamesPeerBytesAndRate(t *testing.T) {
	var ts transfers
	full := NormalizeImage("nginx:1.22")
	if got := ts.describe("nginx:1.22", time.Now()); got != "" {
		t.Fatalf("nothing in flight: %q", got)
	}
	n, done := ts.track(full, "n2")
	r := countingReadCloser{io.NopCloser(strings.NewReader(strings.Repeat("x", 3_000_000))), n}
	if _, err := io.CopyN(io.Discard, r, 2_000_000); err != nil {
		t.Fatal(err)
	}
	got := ts.describe("nginx:1.22", time.Now().Add(2*time.Second))
	// 2 MB in a bit over 2 s.
	if want := "pulling image nginx:1.22 from n2: 2.0 MB so far ("; !strings.HasPrefix(got, want) || !strings.HasSuffix(got, " kB/s)") && !strings.HasSuffix(got, " MB/s)") {
		t.Fatalf("got %q, want %q and a rate near 1 MB/s", got, want)
	}
	done()
	untrack := ts.unpacking(full)
	if got := ts.describe("nginx:1.22", time.Now()); !strings.HasPrefix(got, "unpacking image nginx:1.22") {
		t.Fatalf("unpacking: %q", got)
	}
	untrack()
	if got := ts.describe("nginx:1.22", time.Now()); got != "" {
		t.Fatalf("after the transfer: %q", got)
	}
}
