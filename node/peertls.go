package node

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Node-to-node requests in a secure cluster (log proxying, image
// fetches) go over mutual TLS to the callee's peer port (the gossip port
// + 1), both ends presenting their node certificates. A certificate is
// accepted when it chains to the cluster CA and its key is the one its
// node name is bound to (the signer of the node's certified status
// record, as for records): every node holds the CA key, so the chain
// alone would let any node pose as another. The operator's API token is
// never involved. With --insecure (no CA) these requests go to the
// peer's TCP API, signed with the node key (peerauth.go).

// errPeerCert is wrapped by every peer certificate refusal.
var errPeerCert = errors.New("peer certificate refused")

// checkPeerCert checks a peer's certificate (already verified against the
// CA by crypto/tls) for node name: its key must be the key name is bound
// to and not revoked.
func (a *Agent) checkPeerCert(cert *x509.Certificate, name string) error {
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok {
		return fmt.Errorf("%w: not an Ed25519 key", errPeerCert)
	}
	bound, ok := a.id.boundKey(name)
	if !ok {
		return fmt.Errorf("%w: %q is not a node this one knows", errPeerCert, oneLine(name))
	}
	if !bytes.Equal(bound, pub) {
		return fmt.Errorf("%w: key %s is not node %q's (%s)", errPeerCert, keyID(pub), oneLine(name), keyID(bound))
	}
	if a.id.isRevoked(pub) {
		return fmt.Errorf("%w: key %s of %q is revoked", errPeerCert, keyID(pub), oneLine(name))
	}
	return nil
}

// tlsCert is this node's current certificate for TLS, with the CA's.
func (a *Agent) tlsCert() *tls.Certificate {
	cert := a.nodeCert.Load()
	return &tls.Certificate{Certificate: [][]byte{cert.Raw, a.creds.CA.Raw}, PrivateKey: a.id.key, Leaf: cert}
}

func (a *Agent) caPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(a.creds.CA)
	return pool
}

// peerServerTLS is the peer listener's TLS configuration: this node's
// certificate; a client certificate is optional at the handshake (a
// joining node has none yet) and, when given, must chain to the CA;
// requirePeerCert guards the routes that need one.
func (a *Agent) peerServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return a.tlsCert(), nil },
		ClientAuth:     tls.VerifyClientCertIfGiven,
		ClientCAs:      a.caPool(),
	}
}

// peerClientTLS is the TLS configuration for calling node name: its
// certificate must chain to the CA, name it, and carry its bound key.
func (a *Agent) peerClientTLS(name string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		RootCAs:              a.caPool(),
		ServerName:           name, // node certificates carry their name as a DNS SAN
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return a.tlsCert(), nil },
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: none", errPeerCert)
			}
			return a.checkPeerCert(cs.PeerCertificates[0], name)
		},
	}
}

// requirePeerCert admits requests from nodes only: a client certificate
// that chains to the CA (checked by crypto/tls) and whose key is its
// node's (checkPeerCert). The request is marked as proxied by the caller,
// so it is answered here and never forwarded again.
func (a *Agent) requirePeerCert(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			writeError(w, http.StatusUnauthorized, errors.New("this port serves nodes: present a node certificate"))
			return
		}
		cert := r.TLS.PeerCertificates[0]
		if err := a.checkPeerCert(cert, cert.Subject.CommonName); err != nil {
			writeError(w, http.StatusForbidden, err)
			return
		}
		r.Header.Set(proxiedHeader, cert.Subject.CommonName)
		next.ServeHTTP(w, r)
	})
}

// errNoPeerAPI: with --insecure, the peer serves no TCP API to call.
var errNoPeerAPI = errors.New("the node serves no TCP API at its gossip address (with --insecure, start agents with --api-listen and --token-file)")

// peerGet sends GET uri to node name: over mutual TLS to its peer port in
// a secure cluster, else to its TCP API signed with this node's key. The
// response is the caller's to close. No overall timeout (logs and images
// stream): ctx bounds it.
func (a *Agent) peerGet(ctx context.Context, name string, s NodeStatus, uri string) (*http.Response, error) {
	if a.creds == nil {
		api, ok := a.peerAPI(name, s)
		if !ok {
			return nil, errNoPeerAPI
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, api+uri, nil)
		if err != nil {
			return nil, err
		}
		a.id.signPeerRequest(req, name, time.Now())
		req.Header.Set(proxiedHeader, a.cfg.Name)
		return peerClient.Do(req)
	}
	addr, ok := a.peerAddr(name)
	if !ok {
		return nil, fmt.Errorf("node %s is not a live member", name)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+uri, nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSClientConfig:       a.peerClientTLS(name),
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		DisableKeepAlives:     true,
	}}
	return client.Do(req)
}

// peerAddr is node name's peer port, at the address membership knows it
// by.
func (a *Agent) peerAddr(name string) (string, bool) {
	for _, m := range a.cluster.Members() {
		if m.Name == name {
			return net.JoinHostPort(m.Addr, strconv.Itoa(peerPort(int(m.Port)))), true
		}
	}
	return "", false
}
