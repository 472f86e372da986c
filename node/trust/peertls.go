package trust

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/member"
)

// Node-to-node requests in a secure cluster (log proxying, image
// fetches, key rotation) go over mutual TLS to the callee's peer port
// (the gossip port + 1), both ends presenting their node certificates. A
// certificate is accepted when it chains to the cluster CA and its key is
// the one its node name is bound to (the signer of the node's certified
// status record, as for records) and not revoked: every node holds the
// CA key, so the chain alone would let any node pose as another. The
// operator's API token is never involved. With --insecure (no CA) these
// requests go to the peer's TCP API, signed with the node key
// (peerauth.go).

// Trust is what a node of a secure cluster proves itself with and checks
// peers against: the cluster credentials, its current certificate (which
// RenewLoop renews) and key, and the identities it holds (bound keys,
// revocations). A nil *Trust is a node running with --insecure.
type Trust struct {
	Creds *Credentials
	key   ed25519.PrivateKey
	id    *Identity
	Cert  atomic.Pointer[x509.Certificate]
}

func NewTrust(creds *Credentials, key ed25519.PrivateKey, id *Identity) *Trust {
	t := &Trust{Creds: creds, key: key, id: id}
	t.Cert.Store(creds.NodeCert)
	return t
}

// errPeerCert is wrapped by every peer certificate refusal, and
// errPeerRevoked by that of a revoked key.
var (
	errPeerCert    = errors.New("peer certificate refused")
	errPeerRevoked = fmt.Errorf("%w: revoked", errPeerCert)
)

// check checks a peer's certificate (already verified against the CA) for
// node name: its key must be the key name is bound to, and not revoked.
func (t *Trust) check(cert *x509.Certificate, name string) error {
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok {
		return fmt.Errorf("%w: not an Ed25519 key", errPeerCert)
	}
	// Revoked first: a forgotten node's name is no longer bound, and it
	// is told it was forgotten, not that it is unknown.
	if t.id.IsRevoked(pub) {
		return fmt.Errorf("%w: key %s of %q is revoked ('starling node forget %s')", errPeerRevoked, member.KeyID(pub), api.OneLine(name), api.OneLine(name))
	}
	bound, ok := t.id.BoundKey(name)
	if !ok {
		return fmt.Errorf("%w: %q is not a node this one knows", errPeerCert, api.OneLine(name))
	}
	if !bytes.Equal(bound, pub) {
		return fmt.Errorf("%w: key %s is not node %q's (%s)", errPeerCert, member.KeyID(pub), api.OneLine(name), member.KeyID(bound))
	}
	return nil
}

// isNode reports whether name is a node this one holds a certified,
// unrevoked identity of.
func (t *Trust) isNode(name string) bool {
	key, ok := t.id.BoundKey(name)
	return ok && !t.id.IsRevoked(key)
}

// TLSCert is this node's current certificate for TLS, with the CA's.
func (t *Trust) TLSCert() *tls.Certificate {
	cert := t.Cert.Load()
	return &tls.Certificate{Certificate: [][]byte{cert.Raw, t.Creds.CA.Raw}, PrivateKey: t.key, Leaf: cert}
}

// CertDER is this node's certificate (DER); nil with --insecure.
func (t *Trust) CertDER() []byte {
	if t == nil {
		return nil
	}
	return t.Cert.Load().Raw
}

func (t *Trust) caPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(t.Creds.CA)
	return pool
}

// ServerTLS is the peer listener's TLS configuration: this node's
// certificate; a client certificate is optional at the handshake (a
// joining node has none yet) and, when given, must chain to the CA;
// RequirePeer guards the routes that need one.
func (t *Trust) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return t.TLSCert(), nil },
		ClientAuth:     tls.VerifyClientCertIfGiven,
		ClientCAs:      t.caPool(),
	}
}

// ClientTLS is the TLS configuration for calling node name: its
// certificate must chain to the CA, name it, and carry its bound key.
func (t *Trust) ClientTLS(name string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		RootCAs:              t.caPool(),
		ServerName:           name, // node certificates carry their name as a DNS SAN
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return t.TLSCert(), nil },
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: none", errPeerCert)
			}
			return t.check(cs.PeerCertificates[0], name)
		},
	}
}

// anyNodeTLS is ClientTLS for an address whose node name is not known (a
// seed): any node of the cluster will do, its name taken from its
// certificate and checked like ClientTLS's.
func (t *Trust) anyNodeTLS() *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		InsecureSkipVerify:   true, //nolint:gosec // verified in VerifyConnection: the chain, then the name's bound key
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return t.TLSCert(), nil },
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: none", errPeerCert)
			}
			leaf := cs.PeerCertificates[0]
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: t.caPool(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("%w: %v", errPeerCert, err)
			}
			return t.check(leaf, leaf.Subject.CommonName)
		},
	}
}

// peerClient is an API client of the peer port at addr over mutual TLS
// (conf), each request bounded to 15 s.
func peerClient(addr string, conf *tls.Config) (*client.Client, error) {
	return client.New("https://"+addr, client.WithTransport(PeerHTTPClient(conf, 0).Transport), client.WithTimeout(15*time.Second))
}

// PeerHTTPClient is an HTTP client over conf, one connection per
// request, each bounded to timeout (0: none).
func PeerHTTPClient(conf *tls.Config, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSClientConfig:       conf,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		DisableKeepAlives:     true,
	}}
}

// RequirePeer admits requests from nodes only: a client certificate that
// chains to the CA (checked by crypto/tls) and whose key is its node's
// (check). The request is marked as proxied by the caller, so it is
// answered here and never forwarded again.
func (t *Trust) RequirePeer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			apiserver.WriteError(w, api.Errorf(http.StatusUnauthorized, "this port serves nodes: present a node certificate"))
			return
		}
		cert := r.TLS.PeerCertificates[0]
		if err := t.check(cert, cert.Subject.CommonName); err != nil {
			if errors.Is(err, errPeerRevoked) {
				apiserver.WriteError(w, api.RevokedError(err))
				return
			}
			apiserver.WriteError(w, api.NewError(http.StatusForbidden, err))
			return
		}
		r.Header.Set(ProxiedHeader, cert.Subject.CommonName)
		next.ServeHTTP(w, r)
	})
}

// certRenewCheck is how often a running node checks whether its
// certificate needs renewing.
const certRenewCheck = 12 * time.Hour

// RenewLoop renews this node's certificate (RenewNodeCert, saved in
// DataDir) while ctx lasts, and calls renewed after each renewal (the
// next status record carries the new one).
func (t *Trust) RenewLoop(ctx context.Context, dataDir string, ips []netip.Addr, log *slog.Logger, renewed func()) {
	Every(ctx, certRenewCheck, func() {
		c := *t.Creds
		c.NodeCert = t.Cert.Load()
		if err := RenewNodeCert(dataDir, &c, t.key, ips, time.Now()); err != nil {
			log.Error("renew node certificate", "err", err, "file", filepath.Join(dataDir, NodeCertFile))
			return
		}
		if c.NodeCert != t.Cert.Load() {
			t.Cert.Store(c.NodeCert)
			log.Info("renewed node certificate", "notAfter", c.NodeCert.NotAfter)
			renewed()
		}
	})
}

// Every calls f every d until ctx ends (first after d).
func Every(ctx context.Context, d time.Duration, f func()) {
	tk := time.NewTicker(d)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			f()
		}
	}
}

// ErrNoPeerAPI: with --insecure, the peer serves no TCP API to call.
var ErrNoPeerAPI = errors.New("the node serves no TCP API at its gossip address (with --insecure, start agents with --api-listen and --token-file)")

// PeerAddr is node name's peer port, at the address membership knows it
// by.
func PeerAddr(members []gossip.Member, name string) (string, bool) {
	for _, m := range members {
		if m.Name == name {
			return net.JoinHostPort(m.Addr, strconv.Itoa(peerPort(int(m.Port)))), true
		}
	}
	return "", false
}

// ProxiedHeader marks a request one agent forwards to another, so it is
// never forwarded twice.
const ProxiedHeader = "X-Starling-Proxied-By"
