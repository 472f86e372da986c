package trust

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/member"
)

// Joining a secure cluster. A new node holds an invitation (pki.go: its
// key and its certificate, made where the CA key is kept) and the gossip
// address of any member (--join HOST[:PORT]). It opens TLS to that
// member's peer port (the gossip port + 1, 7947 by default), accepts the
// member's certificate only if it chains to the CA the invitation pins,
// and sends its name, its certificate and its signature over them and
// the time (JoinSigningBytes); never its key. The member admits it
// (admit): the certificate chains to the CA, is for that name and key and
// carries a join deadline that has not passed, the signature verifies,
// the key is not revoked and the name is not bound to another key. The
// answer holds the CA certificate and the gossip keys; the node saves
// its key, its certificate and them (0600) and from then on starts
// without the invitation.

// peerPort is the TCP port of a node's peer listener (join, and TLS
// between nodes): its gossip port + 1.
func peerPort(gossipPort int) int { return gossipPort + 1 }

// SpkiPin is the pin of a certificate's key: the hex SHA-256 of its
// SubjectPublicKeyInfo.
func SpkiPin(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

// JoinWithToken asks the members at seeds (gossip addresses) to admit
// the node the invitation in tokenFile invites, as node name, until one
// answers or ctx ends; a refusal (bad invitation, name in use) ends it at
// once. The credentials and the invitation's key are checked against
// the invitation and saved in DataDir; the key is returned.
func JoinWithToken(ctx context.Context, dataDir, tokenFile, name string, seeds []string, defPort int, log *slog.Logger) (*Credentials, ed25519.PrivateKey, error) {
	b, err := ReadSecretFile("--join-token-file", tokenFile)
	if err != nil {
		return nil, nil, err
	}
	inv, err := ReadInvitation(string(b))
	if err != nil {
		return nil, nil, fmt.Errorf("--join-token-file %s: %w", tokenFile, err)
	}
	if inv.Name() != name {
		return nil, nil, fmt.Errorf("--join-token-file %s: the invitation is for node %q, not --name %s (start with --name %s, or make an invitation for %s with 'starling join-token %s')",
			tokenFile, api.OneLine(inv.Name()), name, api.OneLine(inv.Name()), name, name)
	}
	if by, ok := JoinDeadline(inv.Cert); ok && time.Now().After(by) {
		return nil, nil, fmt.Errorf("--join-token-file %s: the invitation's time to join ended %s ago (at %s); make a new one with 'starling join-token %s'",
			tokenFile, time.Since(by).Round(time.Second), by.Format(time.RFC3339), name)
	}
	tlsConf := client.PinnedTLS(inv.Pin, "")
	backoff, began := time.Second, time.Now()
	for {
		// A refusal (bad invitation, name in use) or a server that is not
		// of the invitation's cluster ends the join once every seed
		// answered so; anything else (unreachable, a 5xx) is retried.
		var final []error
		for _, seed := range seeds {
			// Like gossip, a seed without a port is at this node's own
			// gossip port.
			host, port, err := SplitHostPort(seed, defPort)
			if err != nil {
				return nil, nil, fmt.Errorf("--join %q: %w", seed, err)
			}
			// The request names the member it is for, and goes only to
			// that member (its key pinned).
			addr := net.JoinHostPort(host, strconv.Itoa(peerPort(port)))
			pin, err := serverPin(ctx, addr, tlsConf)
			var resp api.JoinAnswer
			var req api.JoinRequest
			if err == nil {
				req = SignJoinRequest(name, inv.Key, inv.Cert.Raw, pin, time.Now())
				resp, err = postJoin(ctx, "https://"+addr, client.PinnedTLS(inv.Pin, pin), req)
			}
			if err == nil {
				creds, err := acceptJoin(&resp, inv)
				if err != nil {
					return nil, nil, fmt.Errorf("join through %s: %w", seed, err)
				}
				if err := saveNodeKey(dataDir, inv.Key); err != nil {
					return nil, nil, err
				}
				if err := saveCredentials(dataDir, creds); err != nil {
					return nil, nil, err
				}
				log.Info("joined the cluster with an invitation", "through", seed, "ca", inv.Pin[:16], "key", member.KeyID(req.Key), "took", time.Since(began))
				return creds, inv.Key, nil
			}
			var se *apierrors.StatusError
			switch {
			case errors.As(err, &se) && se.ErrStatus.Code < 500:
				final = append(final, fmt.Errorf("join through %s refused: %s", seed, api.OneLine(se.ErrStatus.Message)))
			case errors.Is(err, client.ErrPinMismatch):
				final = append(final, fmt.Errorf("join through %s: %w", seed, client.ErrPinMismatch))
			default:
				log.Warn("could not join through a seed; retrying", "seed", seed, "err", err, "retryIn", backoff)
			}
		}
		if len(final) == len(seeds) {
			return nil, nil, final[0]
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// postJoin sends a join request to the peer port at base over tlsConf;
// a refusal is an *apierrors.StatusError.
func postJoin(ctx context.Context, base string, tlsConf *tls.Config, req api.JoinRequest) (api.JoinAnswer, error) {
	c, err := client.New(base, client.WithTLS(tlsConf), client.WithTimeout(15*time.Second))
	if err != nil {
		return api.JoinAnswer{}, err
	}
	defer c.Close()
	return c.Join(ctx, req)
}

// SignJoinRequest is the join request of node name holding key and
// certificate cert (DER) to the member whose pin is server, signed at
// now.
func SignJoinRequest(name string, key ed25519.PrivateKey, cert []byte, server string, now time.Time) api.JoinRequest {
	unix := now.Unix()
	return api.JoinRequest{Name: name, Key: key.Public().(ed25519.PublicKey), Cert: cert, Server: server, Time: unix,
		Sig: ed25519.Sign(key, JoinSigningBytes(name, cert, server, unix))}
}

// serverPin opens TLS to addr with tlsConf (which checks the cluster CA)
// and returns the pin of the member's certificate.
func serverPin(ctx context.Context, addr string, tlsConf *tls.Config) (string, error) {
	d := tls.Dialer{Config: tlsConf, NetDialer: &net.Dialer{Timeout: 10 * time.Second}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	certs := conn.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return "", errors.New("the member sent no certificate")
	}
	return SpkiPin(certs[0]), nil
}

// acceptJoin checks a join answer against the invitation: the CA must be
// the one it pins and must have issued its certificate.
func acceptJoin(jr *api.JoinAnswer, inv Invitation) (*Credentials, error) {
	ca, err := x509.ParseCertificate(jr.CA)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if CaPin(ca) != inv.Pin {
		return nil, errors.New("the CA certificate sent is not the one the invitation pins")
	}
	if err := VerifyNodeCert(inv.Cert, ca, inv.Name(), inv.Key.Public().(ed25519.PublicKey), time.Now()); err != nil {
		return nil, err
	}
	if err := checkGossipKeys(jr.GossipKeys); err != nil {
		return nil, err
	}
	return &Credentials{CA: ca, NodeCert: inv.Cert, GossipKeys: jr.GossipKeys}, nil
}

// RenewNodeCert issues a new certificate for this node (same name and
// key) when it holds the CA key and the certificate in creds ends more
// than NodeCertRenewBefore before the CA (a certificate of a build before
// invitations, valid 90 days) or lacks one of ips, and saves it. A node
// without the CA key keeps its certificate, valid as long as the CA.
func RenewNodeCert(dataDir string, creds *Credentials, key ed25519.PrivateKey, ips []netip.Addr, now time.Time) error {
	if creds.CAKey == nil {
		return nil
	}
	missing := false
	for _, ip := range ips {
		found := false
		for _, have := range creds.NodeCert.IPAddresses {
			if a, ok := netip.AddrFromSlice(have); ok && a.Unmap() == ip {
				found = true
			}
		}
		missing = missing || !found
	}
	if !missing && !creds.NodeCert.NotAfter.Before(creds.CA.NotAfter.Add(-NodeCertRenewBefore)) {
		return nil
	}
	cert, err := SignNodeCert(creds.CA, creds.CAKey, creds.NodeCert.Subject.CommonName, key.Public().(ed25519.PublicKey), ips, now, time.Time{})
	if err != nil {
		return err
	}
	if err := WritePEM(filepath.Join(dataDir, NodeCertFile), "CERTIFICATE", cert.Raw); err != nil {
		return fmt.Errorf("write %s: %w", NodeCertFile, err)
	}
	creds.NodeCert = cert
	return nil
}

// ListenPeers opens the peer listener: TLS on the gossip bind address,
// port peerPort (an ephemeral port when gossip's is).
func ListenPeers(bind string, t *Trust) (net.Listener, error) {
	host, port, err := SplitHostPort(bind, 7946)
	if err != nil {
		return nil, fmt.Errorf("--bind %q: %w", bind, err)
	}
	if port != 0 {
		port = peerPort(port)
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer listener (join and TLS between nodes, the gossip port + 1) on %s: %w", addr, err)
	}
	return tls.NewListener(l, t.ServerTLS()), nil
}

// JoinCluster joins a secure cluster with the invitation in tokenFile
// through the member at seed (a gossip address), as node name, and saves
// the credentials in DataDir. It returns the node key (the
// invitation's), the gossip key, the CA certificate and the node's
// certificate (DER). For tools and tests that speak gossip themselves;
// the agent joins by itself.
func JoinCluster(ctx context.Context, dataDir, name, tokenFile, seed string) (nodeKey ed25519.PrivateKey, gossipKey []byte, ca *x509.Certificate, cert []byte, err error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, nil, nil, nil, err
	}
	creds, key, err := JoinWithToken(ctx, dataDir, tokenFile, name, []string{seed}, 7946, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return key, creds.GossipKeys[0], creds.CA, creds.NodeCert.Raw, nil
}

// LoadClusterSecrets reads what a node's data dir holds of the cluster's
// secrets: its gossip keyring (the key in use first), the CA certificate,
// the CA key (nil unless the node holds it) and the node key. For tools
// and tests (the hostile peer plays a node whose files were taken).
func LoadClusterSecrets(dataDir string) (gossipKeys [][]byte, ca *x509.Certificate, caKey, nodeKey ed25519.PrivateKey, err error) {
	creds, err := LoadCredentials(dataDir)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	nodeKey, err = LoadOrCreateNodeKey(dataDir)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return creds.GossipKeys, creds.CA, creds.CAKey, nodeKey, nil
}

// IssueNodeCert issues a node certificate with a cluster CA (see
// JoinCluster); for tools and tests.
func IssueNodeCert(ca *x509.Certificate, caKey ed25519.PrivateKey, name string, pub ed25519.PublicKey) ([]byte, error) {
	c, err := SignNodeCert(ca, caKey, name, pub, nil, time.Now(), time.Time{})
	if err != nil {
		return nil, err
	}
	return c.Raw, nil
}

// SplitHostPort parses "ip:port" or "ip" with a default port.
func SplitHostPort(s string, defPort int) (string, int, error) {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return s, defPort, nil
		}
		return "", 0, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", portStr)
	}
	return host, port, nil
}
