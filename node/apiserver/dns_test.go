package apiserver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/starling-orchestrator/starling/node/api"
)

// askedDNS records the query it is asked.
type askedDNS struct{ q *api.DNSQuery }

func (d askedDNS) Lookup(_ context.Context, q api.DNSQuery) (api.DNSAnswer, error) {
	*d.q = q
	return api.DNSAnswer{Node: "n2", Namespace: q.Namespace}, nil
}

// TestAPeersDNSLookupIsCheckedAndAnsweredHere: a lookup on the peer
// port is checked as an operator's and marked for this node (never
// forwarded again) when the peer did not say which node it is for.
func TestAPeersDNSLookupIsCheckedAndAnsweredHere(t *testing.T) {
	var got api.DNSQuery
	pass := func(h http.Handler) http.Handler { return h }
	h := PeerHandler("n2", nil, nil, nil, askedDNS{&got}, pass)
	for _, tc := range []struct {
		uri, node string
		want      int
	}{
		{"/v1/dns/lookup?name=hello&namespace=shop&from=web-0", "n2", http.StatusOK},
		{"/v1/dns/lookup?name=hello&namespace=shop&from=web-0&node=n3", "n3", http.StatusOK},
		{"/v1/dns/lookup?name=hello&namespace=shop&from=../x", "", http.StatusBadRequest},
		{"/v1/dns/lookup?name=hello&namespace=shop&node=N%0A3", "", http.StatusBadRequest},
		{"/v1/dns/lookup?name=hello&type=AXFR", "", http.StatusBadRequest},
	} {
		got = api.DNSQuery{}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", tc.uri, nil))
		if rec.Code != tc.want || got.Node != tc.node {
			t.Errorf("%s: %d, asked for node %q; want %d, %q", tc.uri, rec.Code, got.Node, tc.want, tc.node)
		}
	}
}
