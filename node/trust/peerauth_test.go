package trust

import (
	"crypto/ed25519"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestPeerRequestsAreSignedByTheNodeNotTheToken: a node's request to a
// peer carries its signature and never the operator's token; the peer
// accepts it only for the peer routes, only for itself, only within the
// clock skew, only from the key the caller's name is bound to.
func TestPeerRequestsAreSignedByTheNodeNotTheToken(t *testing.T) {
	a := &Identity{Name: "n1", Key: keyOf("n1")}
	bound := func(name string) ([]byte, bool) {
		if name == "n1" {
			return keyOf("n1").Public().(ed25519.PublicKey), true
		}
		return nil, false
	}
	now := time.Unix(1_800_000_000, 0)
	signed := func(method, uri, to string, at time.Time) *http.Request {
		r := httptest.NewRequest(method, uri, nil)
		a.SignPeerRequest(r, to, at)
		if h := r.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer") || len(h) < 20 {
			t.Fatalf("Authorization = %q", h)
		}
		return r
	}
	if from, err := VerifyPeerRequest(signed("GET", "/v1/images/blobs/sha256:0123", "n2", now), "n2", bound, now); err != nil || from != "n1" {
		t.Fatalf("a good request: %q %v", from, err)
	}
	for name, tc := range map[string]struct {
		r    *http.Request
		self string
		at   time.Time
	}{
		"meant for another node": {signed("GET", "/v1/logs/default/x", "n3", now), "n2", now},
		"too old":                {signed("GET", "/v1/logs/default/x", "n2", now.Add(-2*time.Minute)), "n2", now},
		"from the future":        {signed("GET", "/v1/logs/default/x", "n2", now.Add(2*time.Minute)), "n2", now},
		"another URI": {func() *http.Request {
			r := signed("GET", "/v1/logs/default/x", "n2", now)
			r.URL.Path = "/v1/logs/default/y"
			return r
		}(), "n2", now},
		"unknown node": {func() *http.Request {
			r := signed("GET", "/v1/logs/default/x", "n2", now)
			r.Header.Set(HeaderPeerNode, "n9")
			return r
		}(), "n2", now},
	} {
		if _, err := VerifyPeerRequest(tc.r, tc.self, bound, tc.at); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Through the middleware: peer routes only.
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	h := RequireAuth(ok, "operator-token-0123456789", "n2", false, bound)
	for _, tc := range []struct {
		method, uri string
		want        int
	}{
		{"GET", "/v1/images/blobs/sha256:0123", http.StatusOK},
		{"GET", "/v1/logs/default/x", http.StatusOK},
		{"GET", "/v1/dns/lookup?name=hello&from=web-0&node=n2", http.StatusOK},
		{"POST", "/v1/apply", http.StatusForbidden},
		{"GET", "/v1/objects/deployment", http.StatusForbidden},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, signed(tc.method, tc.uri, "n2", time.Now()))
		if rec.Code != tc.want {
			t.Errorf("%s %s with a node signature: %d, want %d", tc.method, tc.uri, rec.Code, tc.want)
		}
	}
	rec := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/v1/apply", nil)
	r.Header.Set("Authorization", "Bearer operator-token-0123456789")
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusOK {
		t.Errorf("the operator's token: %d", rec.Code)
	}
}
