package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
)

// Version is the agent's version, set at build time with
// -ldflags "-X github.com/starling-orchestrator/starling/node.Version=...".
var Version = "dev"

// admin is what an operator runs on the cluster's credentials (join
// tokens, the client config, key rotation): apiserver.Admin. join and
// keys are nil with --insecure, and answer so.
type admin struct {
	*trust.Admission
	keys   *trust.Keyring
	status *self
	token  string
	trust  *trust.Trust
}

var _ apiserver.Admin = admin{}

// ClientConfig is what 'starling config' writes for the CLI. It holds the
// API token, so it is served where the token is already known or not
// needed: the unix socket (root only) and the TCP API behind the token.
func (ad admin) ClientConfig() api.ClientConfig {
	cc := api.ClientConfig{Server: ad.status.apiURL(), Token: ad.token}
	if ad.trust != nil {
		cc.CAPin, cc.ServerPin = trust.CaPin(ad.trust.Creds.CA), trust.SpkiPin(ad.trust.Cert.Load())
	}
	return cc
}

// RotateKeys rotates the cluster's gossip key from this node.
func (ad admin) RotateKeys(ctx context.Context) (api.KeyRotation, error) {
	return ad.keys.RotateKeys(ctx)
}

// peerAPI is what other nodes ask this one on the peer port.
type peerAPI struct {
	*trust.Admission
	*trust.Keyring
}

var _ apiserver.Peer = peerAPI{}

// backend is the operator's API of this agent.
func (a *Agent) backend() apiserver.Backend {
	return apiserver.Backend{
		Node:          a.cfg.Name,
		Objects:       a.api.objects,
		Info:          a.api.info,
		Admin:         admin{Admission: a.guard.join, keys: a.guard.keys, status: a.own.status, token: a.api.token, trust: a.guard.trust},
		Images:        a.work.images,
		Logs:          a.work.logs,
		DNS:           a.dnsBackend(),
		Metrics:       promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{}),
		MaxImageBytes: a.cfg.MaxImageBytes,
		Log:           a.log,
	}
}

// dnsBackend is the node's DNS for the API (nil without one).
func (a *Agent) dnsBackend() apiserver.DNS {
	if a.network.dns == nil {
		return nil
	}
	return a.network.dns
}

// handler is the operator's API (apiserver.Handler over backend).
func (a *Agent) handler() http.Handler { return apiserver.Handler(a.backend()) }

// peerHandler is the node-to-node API of the peer port.
func (a *Agent) peerHandler() http.Handler {
	return apiserver.PeerHandler(a.cfg.Name, peerAPI{a.guard.join, a.guard.keys}, a.work.logs, a.work.images, a.dnsBackend(), a.guard.trust.RequirePeer)
}

// listen opens the agent's API listeners: the unix socket (always), the
// TCP API (--api-listen; TLS with the node's certificate and the token
// in a secure cluster) and the peer port (a secure cluster only), each
// with its server.
func (a *Agent) listen() ([]*http.Server, []net.Listener, error) {
	handler := a.handler()
	sock := SocketPath(a.cfg.DataDir)
	os.Remove(sock)
	ul, err := net.Listen("unix", sock)
	if err != nil {
		return nil, nil, fmt.Errorf("API socket %s: %w", sock, err)
	}
	servers := []*http.Server{{Handler: handler}}
	listeners := []net.Listener{ul}
	fail := func(err error) ([]*http.Server, []net.Listener, error) {
		for _, l := range listeners {
			l.Close()
		}
		return nil, nil, err
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		return fail(err)
	}
	if a.cfg.APIListen != "" {
		tl, err := net.Listen("tcp", a.cfg.APIListen)
		if err != nil {
			return fail(fmt.Errorf("--api-listen %s: %w", a.cfg.APIListen, err))
		}
		if a.guard.trust != nil {
			// TLS with the node's certificate; clients check it against
			// the cluster CA's pin (starling config).
			tl = tls.NewListener(tl, &tls.Config{MinVersion: tls.VersionTLS12,
				GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return a.guard.trust.TLSCert(), nil }})
		}
		auth := trust.RequireAuth(handler, a.api.token, a.cfg.Name, a.guard.trust != nil, a.guard.id.BoundKey)
		servers = append(servers, &http.Server{Handler: auth, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute})
		listeners = append(listeners, tl)
	}
	if a.guard.trust != nil {
		pl, err := trust.ListenPeers(a.cfg.BindAddr, a.guard.trust)
		if err != nil {
			return fail(err)
		}
		servers = append(servers, &http.Server{Handler: a.peerHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute})
		listeners = append(listeners, pl)
	}
	return servers, listeners, nil
}

// serve runs the servers on their listeners until ctx ends (then shuts
// them down, 5 s at most) or one fails (its error is returned).
func serve(ctx context.Context, servers []*http.Server, listeners []net.Listener) error {
	errc := make(chan error, len(servers))
	for i := range servers {
		go func(s *http.Server, l net.Listener) {
			if err := s.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}(servers[i], listeners[i])
	}
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	shutdownCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer stop()
	for _, s := range servers {
		s.Shutdown(shutdownCtx)
	}
	return err
}
