package node

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestImageImportOverTheCapIsRefused: a tarball over --max-image-size is
// cut off while it streams and refused with 413 naming the limit; one at
// the limit goes through.
func TestImageImportOverTheCapIsRefused(t *testing.T) {
	n := start(t, "a0", t.TempDir(), nil, func(c *testSetup) { c.MaxImageBytes = 4096 })
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
