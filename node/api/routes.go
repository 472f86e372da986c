package api

import (
	"fmt"
	"net/url"
	"strings"
)

// Route is one endpoint of the agent's API: an HTTP method and a path
// pattern in net/http.ServeMux syntax, whose {name} segments Path fills
// in. The server registers every route from this table and the client
// (node/client) builds every request from it, so a path is written once.
type Route struct {
	Method  string
	Pattern string
}

// The operator's API: the unix socket <data-dir>/starling.sock, or TCP
// (--api-listen) with TLS and a bearer token.
var (
	RouteVersion      = Route{"GET", "/v1/version"}                              // -> Version
	RouteApply        = Route{"POST", "/v1/apply"}                               // ApplyRequest -> ApplyResponse
	RouteObjects      = Route{"GET", "/v1/objects/{kind}"}                       // -> ObjectList
	RouteObject       = Route{"GET", "/v1/objects/{kind}/{namespace}/{name}"}    // -> Object
	RouteDeleteObject = Route{"DELETE", "/v1/objects/{kind}/{namespace}/{name}"} // -> ApplyResult
	RouteScale        = Route{"POST", "/v1/scale/{namespace}/{name}"}            // ScaleRequest (?kind=statefulset) -> ApplyResult
	RouteReplicas     = Route{"GET", "/v1/replicas"}                             // -> ReplicaList
	RouteNodes        = Route{"GET", "/v1/nodes"}                                // -> NodeList
	RouteForgetNode   = Route{"DELETE", "/v1/nodes/{name}"}                      // -> ForgetResult
	RouteJoinTokens   = Route{"POST", "/v1/join-tokens"}                         // JoinTokenRequest -> JoinToken
	RouteClientConfig = Route{"GET", "/v1/client-config"}                        // -> ClientConfig
	RouteRotateKeys   = Route{"POST", "/v1/keys/rotate"}                         // -> KeyRotation
	RouteLogs         = Route{"GET", "/v1/logs/{namespace}/{name}"}              // LogOptions as query -> text stream
	RouteImportImages = Route{"POST", "/v1/images"}                              // tarball -> ImageList
	RouteImages       = Route{"GET", "/v1/images"}                               // -> ImageList
	RouteImageBlob    = Route{"GET", "/v1/images/blobs/{digest}"}                // -> blob bytes
	RouteRollout      = Route{"GET", "/v1/rollout/{namespace}/{name}/status"}    // -> RolloutStatus
	RouteHistory      = Route{"GET", "/v1/rollout/{namespace}/{name}/history"}   // -> RevisionList
	RouteUndo         = Route{"POST", "/v1/rollout/{namespace}/{name}/undo"}     // UndoRequest -> ApplyResult
	RouteRestart      = Route{"POST", "/v1/rollout/{namespace}/{name}/restart"}  // -> ApplyResult
	RoutePause        = Route{"POST", "/v1/rollout/{namespace}/{name}/pause"}    // -> ApplyResult
	RouteResume       = Route{"POST", "/v1/rollout/{namespace}/{name}/resume"}   // -> ApplyResult
	RouteRelease      = Route{"POST", "/v1/volumes/{namespace}/{name}/release"}  // -> ApplyResult
	RouteMetrics      = Route{"GET", "/metrics"}                                 // -> Prometheus text
	RouteDNSLookup    = Route{"GET", "/v1/dns/lookup"}                           // DNSQuery.Values -> DNSAnswer
)

// The peer port (gossip port + 1): mutual TLS with node certificates,
// between nodes only, but for /v1/join, which a joining node calls with
// its join token.
var (
	RouteJoin     = Route{"POST", "/v1/join"}                   // JoinRequest -> JoinAnswer
	RoutePeerLogs = Route{"GET", "/v1/logs/{namespace}/{name}"} // as RouteLogs
	RoutePeerBlob = Route{"GET", "/v1/images/blobs/{digest}"}   // as RouteImageBlob
	RoutePeerDNS  = Route{"GET", "/v1/dns/lookup"}              // as RouteDNSLookup, with DNSQuery.Node
	RouteKeys     = Route{"GET", "/v1/keys"}                    // -> KeyList
	RouteKeyOp    = Route{"POST", "/v1/keys"}                   // KeyOp -> 200
)

// String is the route as a net/http.ServeMux pattern: "GET /v1/nodes".
func (r Route) String() string { return r.Method + " " + r.Pattern }

// Path fills the route's {name} segments with args, in order, each
// escaped as one path segment. It panics when the number of args is not
// the number of segments (a programming error).
func (r Route) Path(args ...string) string {
	var b strings.Builder
	rest := r.Pattern
	n := 0
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			b.WriteString(rest)
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			panic(fmt.Sprintf("api: malformed route %s", r.Pattern))
		}
		b.WriteString(rest[:i])
		if n >= len(args) {
			panic(fmt.Sprintf("api: route %s needs more than %d arguments", r.Pattern, len(args)))
		}
		b.WriteString(url.PathEscape(args[n]))
		n++
		rest = rest[i+j+1:]
	}
	if n != len(args) {
		panic(fmt.Sprintf("api: route %s takes %d arguments, got %d", r.Pattern, n, len(args)))
	}
	return b.String()
}
