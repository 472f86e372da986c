package trust

import (
	"bytes"
	"crypto/ed25519"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
)

// With --insecure (no cluster CA, so no mutual TLS: peertls.go),
// node-to-node requests (log proxying, image fetches) go to the peer's
// TCP API and are authenticated
// with the calling node's own key, not with the operator's API token: the
// token never leaves the node it was presented to. The caller signs the
// method, the request URI, the node it is meant for and the time; the
// callee accepts the request when the signature verifies with the key
// the caller's name is bound to (its status record's signer), the time is
// within peerAuthSkew of its own, and the request was meant for it. Such
// a request reaches only the peer routes (peerRoute), never the rest of
// the API.

const (
	HeaderPeerNode = "X-Starling-Node"
	headerPeerDate = "X-Starling-Date"
	peerAuthScheme = "Starling-Node "
	peerAuthSkew   = time.Minute
	peerAuthCtx    = "starling peer request v1\x00"
)

// peerSigningBytes is what a peer request's signature covers.
func peerSigningBytes(method, requestURI, from, to string, unix int64) []byte {
	return []byte(peerAuthCtx + method + "\n" + requestURI + "\n" + from + "\n" + to + "\n" + strconv.FormatInt(unix, 10))
}

// SignPeerRequest authenticates req, meant for node to, as this node.
func (id *Identity) SignPeerRequest(req *http.Request, to string, now time.Time) {
	unix := now.Unix()
	sig := ed25519.Sign(id.Key, peerSigningBytes(req.Method, req.URL.RequestURI(), id.Name, to, unix))
	req.Header.Set(HeaderPeerNode, id.Name)
	req.Header.Set(headerPeerDate, strconv.FormatInt(unix, 10))
	req.Header.Set("Authorization", peerAuthScheme+base64.StdEncoding.EncodeToString(sig))
}

// errPeerAuth is wrapped by every VerifyPeerRequest error.
var errPeerAuth = errors.New("node authentication failed")

// VerifyPeerRequest checks a request signed by SignPeerRequest for node
// self, with bound giving each node name's key, and returns the caller.
func VerifyPeerRequest(r *http.Request, self string, bound func(string) ([]byte, bool), now time.Time) (string, error) {
	auth := r.Header.Get("Authorization")
	if !strings.HasPrefix(auth, peerAuthScheme) {
		return "", fmt.Errorf("%w: no node signature", errPeerAuth)
	}
	sig, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(auth, peerAuthScheme))
	if err != nil || len(sig) != ed25519.SignatureSize {
		return "", fmt.Errorf("%w: malformed signature", errPeerAuth)
	}
	from := r.Header.Get(HeaderPeerNode)
	key, ok := bound(from)
	if !ok || len(key) != ed25519.PublicKeySize {
		return "", fmt.Errorf("%w: unknown node %q", errPeerAuth, api.OneLine(from))
	}
	unix, err := strconv.ParseInt(r.Header.Get(headerPeerDate), 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: malformed date", errPeerAuth)
	}
	if d := now.Sub(time.Unix(unix, 0)); d > peerAuthSkew || d < -peerAuthSkew {
		return "", fmt.Errorf("%w: request time is %s off (at most %s; check the clocks)", errPeerAuth, d.Round(time.Second), peerAuthSkew)
	}
	if !ed25519.Verify(key, peerSigningBytes(r.Method, r.URL.RequestURI(), from, self, unix), sig) {
		return "", fmt.Errorf("%w: bad signature from %q (or the request was meant for another node)", errPeerAuth, from)
	}
	return from, nil
}

// peerRoutes are the requests one node makes of another on the TCP API
// with --insecure (log proxying, image blobs, DNS lookups from a
// replica).
var peerRoutes = func() *http.ServeMux {
	m := http.NewServeMux()
	for _, r := range []api.Route{api.RoutePeerLogs, api.RoutePeerBlob, api.RoutePeerDNS} {
		m.Handle(r.String(), http.NotFoundHandler())
	}
	return m
}()

// peerRoute reports whether r is one of the requests one node makes of
// another (peerRoutes).
func peerRoute(r *http.Request) bool {
	if r.Method != http.MethodGet {
		return false
	}
	_, pattern := peerRoutes.Handler(r)
	return pattern != ""
}

// RequireAuth guards the TCP API of node self: the operator's bearer
// token for every route, or, with --insecure (secure false), a node's
// signature (VerifyPeerRequest; bound gives each node name's key) for
// the peer routes.
func RequireAuth(next http.Handler, token, self string, secure bool, bound func(string) ([]byte, bool)) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) == 1 {
			next.ServeHTTP(w, r)
			return
		}
		// In a secure cluster nodes call each other over mutual TLS on
		// the peer port (peertls.go); signed requests are for --insecure.
		if bytes.HasPrefix(got, []byte(peerAuthScheme)) && !secure {
			if !peerRoute(r) {
				apiserver.WriteError(w, api.Errorf(http.StatusForbidden, "a node's signature opens only the peer routes (logs, image blobs)"))
				return
			}
			if _, err := VerifyPeerRequest(r, self, bound, time.Now()); err != nil {
				apiserver.WriteError(w, api.NewError(http.StatusUnauthorized, err))
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		apiserver.WriteError(w, api.Errorf(http.StatusUnauthorized, "missing or wrong bearer token (pass --token or set STARLING_TOKEN)"))
	})
}
