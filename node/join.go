package node

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
	"slices"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
)

// Joining a secure cluster. A new node holds a join token (pki.go) and the
// gossip address of any member (--join HOST[:PORT]). It opens TLS to that
// member's peer port (the gossip port + 1, 7947 by default), accepts the
// member's certificate only if it chains to the CA the token pins, and
// sends its name, its public node key and the token's ID and secret. The
// member admits it (admit): the token must be a live one (a
// joinTokenRecord, not expired) whose secret hashes to the record's, the
// key must not be revoked and the name must not be bound to another key.
// The answer holds the CA certificate and key, the gossip key and the new
// node's certificate; the node saves them (0600) and from then on starts
// without the token.

// peerPort is the TCP port of a node's peer listener (join, and TLS
// between nodes): its gossip port + 1.
func peerPort(gossipPort int) int { return gossipPort + 1 }

// spkiPin is the pin of a certificate's key: the hex SHA-256 of its
// SubjectPublicKeyInfo.
func spkiPin(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

// joinWithToken asks the members at seeds (gossip addresses) to admit
// node name with key, using the token in tokenFile, until one answers or
// ctx ends; a refusal (bad token, name in use) ends it at once. The
// credentials are checked against the token's pin and saved in dataDir.
func joinWithToken(ctx context.Context, dataDir, tokenFile, name string, key ed25519.PrivateKey, seeds []string, defPort int, log *slog.Logger) (*credentials, error) {
	b, err := readSecretFile("--join-token-file", tokenFile)
	if err != nil {
		return nil, err
	}
	tok, err := parseJoinToken(string(b))
	if err != nil {
		return nil, fmt.Errorf("--join-token-file %s: %w", tokenFile, err)
	}
	req := api.JoinRequest{Name: name, Key: key.Public().(ed25519.PublicKey), TokenID: tok.ID, Secret: tok.Secret}
	tlsConf := client.PinnedTLS(tok.Pin, "")
	backoff, began := time.Second, time.Now()
	for {
		// A refusal (bad token, name in use) or a server that is not of
		// the token's cluster ends the join once every seed answered so;
		// anything else (unreachable, a 5xx) is retried.
		var final []error
		for _, seed := range seeds {
			// Like gossip, a seed without a port is at this node's own
			// gossip port.
			host, port, err := splitHostPort(seed, defPort)
			if err != nil {
				return nil, fmt.Errorf("--join %q: %w", seed, err)
			}
			resp, err := postJoin(ctx, "https://"+net.JoinHostPort(host, strconv.Itoa(peerPort(port))), tlsConf, req)
			if err == nil {
				creds, err := acceptJoin(&resp, tok.Pin, name, key)
				if err != nil {
					return nil, fmt.Errorf("join through %s: %w", seed, err)
				}
				if err := saveCredentials(dataDir, creds); err != nil {
					return nil, err
				}
				log.Info("joined the cluster with a token", "through", seed, "ca", tok.Pin[:16], "token", tok.ID, "took", time.Since(began))
				return creds, nil
			}
			var se *apierrors.StatusError
			switch {
			case errors.As(err, &se) && se.ErrStatus.Code < 500:
				final = append(final, fmt.Errorf("join through %s refused: %s", seed, oneLine(se.ErrStatus.Message)))
			case errors.Is(err, client.ErrPinMismatch):
				final = append(final, fmt.Errorf("join through %s: %w", seed, client.ErrPinMismatch))
			default:
				log.Warn("could not join through a seed; retrying", "seed", seed, "err", err, "retryIn", backoff)
			}
		}
		if len(final) == len(seeds) {
			return nil, final[0]
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
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

// acceptJoin checks a join answer against the token's pin and this node's
// name and key.
func acceptJoin(jr *api.JoinAnswer, pin, name string, key ed25519.PrivateKey) (*credentials, error) {
	ca, err := x509.ParseCertificate(jr.CA)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if caPin(ca) != pin {
		return nil, errors.New("the CA certificate sent is not the one the token pins")
	}
	k, err := x509.ParsePKCS8PrivateKey(jr.CAKey)
	caKey, ok := k.(ed25519.PrivateKey)
	if err != nil || !ok || !caKey.Public().(ed25519.PublicKey).Equal(ca.PublicKey) {
		return nil, errors.New("the CA key sent is not the CA certificate's")
	}
	cert, err := x509.ParseCertificate(jr.Cert)
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	if err := verifyNodeCert(cert, ca, name, key.Public().(ed25519.PublicKey), time.Now()); err != nil {
		return nil, err
	}
	if err := checkGossipKeys(jr.GossipKeys); err != nil {
		return nil, err
	}
	return &credentials{CA: ca, CAKey: caKey, NodeCert: cert, GossipKeys: jr.GossipKeys}, nil
}

// setupCredentials gives a node what it needs to be a member: with
// --insecure, nothing; a node that joined before uses the credentials in
// its data dir; otherwise it joins with --join-token-file, or, given no
// --join, creates a new cluster. The node certificate is renewed (with
// the node's own CA key) when it expires within nodeCertRenewBefore or
// does not name the node's advertised address.
func setupCredentials(ctx context.Context, cfg Config, key ed25519.PrivateKey, log *slog.Logger) (*credentials, error) {
	if cfg.Insecure {
		if _, err := os.Stat(filepath.Join(cfg.DataDir, caCertFile)); err == nil {
			return nil, fmt.Errorf("--insecure: %s belongs to a secure cluster (it holds %s); start without --insecure", cfg.DataDir, caCertFile)
		}
		return nil, nil
	}
	creds, err := loadCredentials(cfg.DataDir)
	switch {
	case err == nil:
		if cfg.JoinTokenFile != "" {
			log.Info("already a member of the cluster: --join-token-file is not needed and not read", "dataDir", cfg.DataDir)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	case cfg.JoinTokenFile != "":
		if len(cfg.Join) == 0 {
			return nil, errors.New("--join-token-file: also give --join with the address of any cluster node")
		}
		_, bindPort, err := splitHostPort(cfg.BindAddr, 7946)
		if err != nil {
			return nil, fmt.Errorf("--bind %q: %w", cfg.BindAddr, err)
		}
		if creds, err = joinWithToken(ctx, cfg.DataDir, cfg.JoinTokenFile, cfg.Name, key, cfg.Join, bindPort, log); err != nil {
			return nil, err
		}
	case len(cfg.Join) == 0:
		if creds, err = initCluster(cfg.DataDir, cfg.Name, key, advertisedIPs(cfg), time.Now()); err != nil {
			return nil, err
		}
		log.Info("created a new cluster (CA, gossip key and this node's certificate in the data dir); invite nodes with 'starling join-token'",
			"ca", caPin(creds.CA)[:16], "dataDir", cfg.DataDir)
	default:
		return nil, fmt.Errorf("--join %s: joining a cluster needs a join token: run 'starling join-token' on any cluster node, save it to a file (chmod 600) and pass --join-token-file FILE",
			strings.Join(cfg.Join, ","))
	}
	if cn := creds.NodeCert.Subject.CommonName; cn != cfg.Name {
		return nil, fmt.Errorf("--name %s: this data dir's certificate is for node %q; start with --name %s", cfg.Name, cn, cn)
	}
	if !creds.NodeCert.PublicKey.(ed25519.PublicKey).Equal(key.Public()) {
		return nil, fmt.Errorf("%s: the certificate is not for this node's key (%s); remove %s and join again with a new token", nodeCertFile, nodeKeyFile, nodeCertFile)
	}
	if err := renewNodeCert(cfg.DataDir, creds, key, advertisedIPs(cfg), time.Now()); err != nil {
		return nil, err
	}
	return creds, nil
}

// renewNodeCert issues a new certificate for this node (same name and key)
// when the one in creds expires within nodeCertRenewBefore or lacks one
// of ips, and saves it.
func renewNodeCert(dataDir string, creds *credentials, key ed25519.PrivateKey, ips []netip.Addr, now time.Time) error {
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
	if !missing && now.Add(nodeCertRenewBefore).Before(creds.NodeCert.NotAfter) {
		return nil
	}
	cert, err := issueNodeCert(creds.CA, creds.CAKey, creds.NodeCert.Subject.CommonName, key.Public().(ed25519.PublicKey), ips, now)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dataDir, nodeCertFile), "CERTIFICATE", cert.Raw); err != nil {
		return fmt.Errorf("write %s: %w", nodeCertFile, err)
	}
	creds.NodeCert = cert
	return nil
}

// advertisedIPs are the addresses a node's certificate names: its
// --advertise host (else its --bind host), and its --api-listen host,
// wildcards left out.
func advertisedIPs(cfg Config) []netip.Addr {
	parse := func(s string) (netip.Addr, bool) {
		host, _, err := splitHostPort(s, 0)
		if s == "" || err != nil {
			return netip.Addr{}, false
		}
		ip, err := netip.ParseAddr(host)
		return ip.Unmap(), err == nil && !ip.IsUnspecified()
	}
	var out []netip.Addr
	if ip, ok := parse(cfg.Advertise); ok {
		out = append(out, ip)
	} else if ip, ok := parse(cfg.BindAddr); ok {
		out = append(out, ip)
	}
	if ip, ok := parse(cfg.APIListen); ok && !slices.Contains(out, ip) {
		out = append(out, ip)
	}
	return out
}

// listenPeers opens the peer listener: TLS on the gossip bind address,
// port peerPort (an ephemeral port when gossip's is).
func listenPeers(bind string, t *trust) (net.Listener, error) {
	host, port, err := splitHostPort(bind, 7946)
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
	return tls.NewListener(l, t.serverTLS()), nil
}

// JoinCluster joins a secure cluster with the token in tokenFile through
// the member at seed (a gossip address), as a node named name whose key
// is (or is made) in dataDir, and saves the credentials there. It returns
// the node key, the gossip key, the CA certificate and key and the node's
// certificate (DER). For tools and tests that speak gossip themselves;
// the agent joins by itself.
func JoinCluster(ctx context.Context, dataDir, name, tokenFile, seed string) (nodeKey ed25519.PrivateKey, gossipKey []byte, ca *x509.Certificate, caKey ed25519.PrivateKey, cert []byte, err error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, nil, nil, nil, nil, err
	}
	key, err := loadOrCreateNodeKey(dataDir)
	if err != nil {
		return nil, nil, nil, nil, nil, err
	}
	creds, err := joinWithToken(ctx, dataDir, tokenFile, name, key, []string{seed}, 7946, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, nil, nil, nil, nil, err
	}
	return key, creds.GossipKeys[0], creds.CA, creds.CAKey, creds.NodeCert.Raw, nil
}

// LoadClusterSecrets reads what a node's data dir holds of the cluster's
// secrets: its gossip keyring (the key in use first), the CA certificate
// and the CA key. For tools and tests (the hostile peer plays a forgotten
// node that kept them).
func LoadClusterSecrets(dataDir string) (gossipKeys [][]byte, ca *x509.Certificate, caKey ed25519.PrivateKey, err error) {
	creds, err := loadCredentials(dataDir)
	if err != nil {
		return nil, nil, nil, err
	}
	return creds.GossipKeys, creds.CA, creds.CAKey, nil
}

// IssueNodeCert issues a node certificate with a cluster CA (see
// JoinCluster); for tools and tests.
func IssueNodeCert(ca *x509.Certificate, caKey ed25519.PrivateKey, name string, pub ed25519.PublicKey) ([]byte, error) {
	c, err := issueNodeCert(ca, caKey, name, pub, nil, time.Now())
	if err != nil {
		return nil, err
	}
	return c.Raw, nil
}
