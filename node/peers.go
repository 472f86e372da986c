package node

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/opencontainers/go-digest"
	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/view"
)

// peers is how this node calls other nodes (log proxying, image blobs).
type peers struct {
	self    string
	trust   *trust.Trust // nil with --insecure
	id      *trust.Identity
	cluster *gossip.Cluster
}

// peerAPIClient calls other agents' TCP APIs (--insecure). No overall
// timeout (logs and images stream), but a peer that does not connect or
// answer in time is given up on.
var peerAPIClient = &http.Client{Transport: &http.Transport{
	DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
	ResponseHeaderTimeout: 30 * time.Second,
	IdleConnTimeout:       90 * time.Second,
}}

// api returns the API URL of a live peer, trusting the URL its status
// record gossips only when its host is the address membership knows the
// peer by: holding the gossip key must not be enough to make this node
// send its token, or proxy requests, somewhere else.
func (p *peers) api(name string, s view.NodeStatus) (string, bool) {
	if s.API == "" {
		return "", false
	}
	u, err := url.Parse(s.API)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" {
		return "", false
	}
	for _, m := range p.cluster.Members() {
		if m.Name == name {
			return s.API, u.Hostname() == m.Addr
		}
	}
	return "", false
}

// endpoint is how this node calls node name: the base URL, the
// transport and what a request needs before it is sent (prepare). In a
// secure cluster that is mutual TLS to the peer's port; with --insecure,
// its TCP API, each request signed with this node's key. prepare also
// drops whatever headers the request carried (a proxied request must not
// take the operator's token along).
func (p *peers) endpoint(name string, s view.NodeStatus) (base *url.URL, rt http.RoundTripper, prepare func(*http.Request), err error) {
	if p.trust == nil {
		api, ok := p.api(name, s)
		if !ok {
			return nil, nil, nil, trust.ErrNoPeerAPI
		}
		if base, err = url.Parse(api); err != nil {
			return nil, nil, nil, err
		}
		return base, peerAPIClient.Transport, func(req *http.Request) {
			req.Header = http.Header{}
			p.id.SignPeerRequest(req, name, time.Now())
			req.Header.Set(trust.ProxiedHeader, p.self)
		}, nil
	}
	addr, ok := trust.PeerAddr(p.cluster.Members(), name)
	if !ok {
		return nil, nil, nil, fmt.Errorf("node %s is not a member", name)
	}
	return &url.URL{Scheme: "https", Host: addr}, trust.PeerHTTPClient(p.trust.ClientTLS(name), 0).Transport,
		func(req *http.Request) { req.Header = http.Header{} }, nil
}

// client is an API client of node name (endpoint).
func (p *peers) client(name string, s view.NodeStatus) (*client.Client, error) {
	base, rt, prepare, err := p.endpoint(name, s)
	if err != nil {
		return nil, err
	}
	return client.New(base.String(), client.WithTransport(preparing{rt, prepare}))
}

// blob fetches content blob d from node name. The response is the
// caller's to close. No overall timeout (images stream): ctx bounds it.
func (p *peers) blob(ctx context.Context, name string, s view.NodeStatus, d digest.Digest) (*http.Response, error) {
	c, err := p.client(name, s)
	if err != nil {
		return nil, err
	}
	return c.Blob(ctx, d.String())
}

// dnsLookup asks node name to look q up (names.Supervisor's Peer).
func (p *peers) dnsLookup(ctx context.Context, name string, s view.NodeStatus, q api.DNSQuery) (api.DNSAnswer, error) {
	c, err := p.client(name, s)
	if err != nil {
		return api.DNSAnswer{}, err
	}
	return c.DNSLookup(ctx, q)
}

// preparing is a RoundTripper that prepares each request before rt
// sends it.
type preparing struct {
	rt      http.RoundTripper
	prepare func(*http.Request)
}

func (p preparing) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	p.prepare(req)
	return p.rt.RoundTrip(req)
}
