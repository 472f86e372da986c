package apiserver

import (
	"cmp"
	"net/http"
	"net/netip"

	"github.com/starling-orchestrator/starling/node/api"
)

// Peer is what nodes ask each other on the peer port.
type Peer interface {
	// Join admits a node with a join token (the caller is not a node
	// yet: from is its address, for the certificate and the logs).
	Join(req api.JoinRequest, from netip.Addr) (api.JoinAnswer, error)
	// Keys is this node's gossip keyring, the key in use first.
	Keys() [][]byte
	// KeyOp installs, uses or removes a gossip key (409 until a
	// revocation the op names has arrived).
	KeyOp(op api.KeyOp) error
}

// PeerHandler is the node-to-node API: join (open to anyone with a
// token), and behind trust.RequirePeer (mutual TLS with a node certificate)
// logs, image blobs, DNS lookups forwarded to this node (answered here,
// never forwarded again) and the gossip keyring.
func PeerHandler(node string, p Peer, logs Logs, images Images, dns DNS, requirePeer func(http.Handler) http.Handler) http.Handler {
	s := &server{b: Backend{Node: node, Logs: logs, Images: images, DNS: dns}}
	mux := http.NewServeMux()
	mux.HandleFunc(api.RouteJoin.String(), func(w http.ResponseWriter, r *http.Request) {
		var req api.JoinRequest
		if err := ReadJSON(w, r, "join request", 64<<10, &req); err != nil {
			WriteError(w, err)
			return
		}
		remote, _ := netip.ParseAddrPort(r.RemoteAddr)
		answer(w, http.StatusOK)(p.Join(req, remote.Addr().Unmap()))
	})
	mux.Handle(api.RoutePeerLogs.String(), requirePeer(http.HandlerFunc(s.logs)))
	mux.Handle(api.RoutePeerBlob.String(), requirePeer(http.HandlerFunc(s.blob)))
	mux.Handle(api.RoutePeerDNS.String(), requirePeer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := api.DNSQueryOf(r.URL.Query())
		q.Node = cmp.Or(q.Node, node)
		s.lookup(w, r, q)
	})))
	mux.Handle(api.RouteKeys.String(), requirePeer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, api.KeyList{Keys: p.Keys()})
	})))
	mux.Handle(api.RouteKeyOp.String(), requirePeer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var op api.KeyOp
		if err := ReadJSON(w, r, "key request", 4<<10, &op); err != nil {
			WriteError(w, err)
			return
		}
		if err := p.KeyOp(op); err != nil {
			WriteError(w, err)
			return
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})))
	return mux
}
