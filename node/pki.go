package node

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// The cluster's public-key infrastructure, after Docker Swarm's and
// kubeadm's: `starling init` (or the first agent, started with no --join)
// makes a certificate authority (an Ed25519 key and a self-signed
// certificate) and the gossip key; a node joins with a join token that
// pins the CA (the SHA-256 of its SubjectPublicKeyInfo, as k3s and
// kubeadm's discovery-token-ca-cert-hash do) and carries a secret; the
// node it contacts checks the secret and hands it the CA, the gossip key
// and a certificate for its name and its own node key.
//
// There is no master: every node holds the CA key, so any node can admit
// a new one and renew its own certificate. Holding the CA key is what
// "being a node" means; docs/real-hosts.md says what that implies when a
// node is compromised.
//
// Files in --data-dir (all 0600):
//
//	ca.crt      the CA certificate (PEM)
//	ca.key      the CA private key (PEM, PKCS #8)
//	node.crt    this node's certificate (PEM), for its node.key
//	gossip.key  the 32-byte gossip key, base64
const (
	caCertFile    = "ca.crt"
	caKeyFile     = "ca.key"
	nodeCertFile  = "node.crt"
	gossipKeyFile = "gossip.key"
)

// Certificate lifetimes. Node certificates are short-lived and renewed by
// the node itself (renewNodeCert) once less than nodeCertRenewBefore is
// left.
const (
	caValidity          = 10 * 365 * 24 * time.Hour
	nodeCertValidity    = 90 * 24 * time.Hour
	nodeCertRenewBefore = 30 * 24 * time.Hour
	// certBackdate allows for clocks a little behind the issuer's.
	certBackdate = 5 * time.Minute
)

// credentials are what makes a node a member of a secure cluster.
type credentials struct {
	CA       *x509.Certificate
	CAKey    ed25519.PrivateKey
	NodeCert *x509.Certificate
	// GossipKeys are the gossip keys (32 bytes, AES-256-GCM, memberlist's
	// keyring), the one in use first; more than one during a rotation.
	GossipKeys [][]byte
}

// caPin is the pin of a CA certificate: the hex SHA-256 of its
// SubjectPublicKeyInfo (64 hex digits).
func caPin(ca *x509.Certificate) string { return spkiPin(ca) }

// newCA makes a CA key and its self-signed certificate (caValidity).
func newCA(now time.Time) (*x509.Certificate, ed25519.PrivateKey, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "starling cluster CA " + keyID(pub)},
		NotBefore:             now.Add(-certBackdate),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

// issueNodeCert issues the certificate of node name for its key pub,
// valid for nodeCertValidity from now, for both TLS ends (server and
// client), with ips (the node's addresses) as IP SANs.
func issueNodeCert(ca *x509.Certificate, caKey ed25519.PrivateKey, name string, pub ed25519.PublicKey, ips []netip.Addr, now time.Time) (*x509.Certificate, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name, Organization: []string{"starling-node"}},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-certBackdate),
		NotAfter:     now.Add(nodeCertValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		return nil, fmt.Errorf("issue certificate for node %s: %w", name, err)
	}
	return x509.ParseCertificate(der)
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// verifyNodeCert checks that cert was issued by ca for node name and key
// pub and is valid at now.
func verifyNodeCert(cert, ca *x509.Certificate, name string, pub []byte, now time.Time) error {
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("certificate of %q: %w", name, err)
	}
	if cert.Subject.CommonName != name {
		return fmt.Errorf("certificate is for node %q, not %q", cert.Subject.CommonName, name)
	}
	certKey, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok || subtle.ConstantTimeCompare(certKey, pub) != 1 {
		return fmt.Errorf("certificate of %q is for key %s, not the record's signer %s", name, keyID(certKey), keyID(pub))
	}
	return nil
}

// certCache remembers node certificates that verified, so that the
// certificate every status record carries costs one map lookup after the
// first: the key is the SHA-256 of (certificate DER, name, signer), the
// value the certificate's NotAfter. Bounded: cleared when full.
type certCache struct {
	ca *x509.Certificate
	mu sync.Mutex
	ok map[[32]byte]time.Time
}

const maxCertCache = 4096

func newCertCache(ca *x509.Certificate) *certCache {
	return &certCache{ca: ca, ok: map[[32]byte]time.Time{}}
}

// verify checks the DER certificate der for node name and key pub.
func (c *certCache) verify(der []byte, name string, pub []byte, now time.Time) error {
	h := sha256.New()
	h.Write(der)
	h.Write([]byte{0})
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write(pub)
	var k [32]byte
	h.Sum(k[:0])
	c.mu.Lock()
	notAfter, hit := c.ok[k]
	c.mu.Unlock()
	if hit && now.Before(notAfter) {
		return nil
	}
	if len(der) == 0 {
		return errors.New("no certificate")
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("certificate does not parse: %w", err)
	}
	if err := verifyNodeCert(cert, c.ca, name, pub, now); err != nil {
		return err
	}
	c.mu.Lock()
	if len(c.ok) >= maxCertCache {
		clear(c.ok)
	}
	c.ok[k] = cert.NotAfter
	c.mu.Unlock()
	return nil
}

// Join tokens, after kubeadm's bootstrap tokens and Swarm's join tokens:
//
//	SLTKN-1-<CA pin, 64 hex digits>-<token ID, 6 of [a-z0-9]>.<secret, 16 of [a-z0-9]>
//
// The pin lets a new node check it talks to this cluster before it sends
// the secret; the secret (about 82 bits) proves the node was invited. The
// cluster keeps only the secret's SHA-256, in a record named by the token
// ID (joinTokenRecord), with an expiry.
const tokenPrefix = "SLTKN-1-"

var tokenRE = regexp.MustCompile(`^SLTKN-1-([0-9a-f]{64})-([a-z0-9]{6})\.([a-z0-9]{16})$`)

// joinToken is a parsed join token.
type joinToken struct {
	Pin    string // hex SHA-256 of the CA's SubjectPublicKeyInfo
	ID     string // 6 of [a-z0-9]
	Secret string // 16 of [a-z0-9]
}

func (t joinToken) String() string { return tokenPrefix + t.Pin + "-" + t.ID + "." + t.Secret }

// parseJoinToken parses a token as 'starling join-token' prints it.
func parseJoinToken(s string) (joinToken, error) {
	m := tokenRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return joinToken{}, errors.New("not a join token (want SLTKN-1-<64 hex digits>-<6 characters>.<16 characters>, as 'starling join-token' prints it)")
	}
	return joinToken{Pin: m[1], ID: m[2], Secret: m[3]}, nil
}

const tokenAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// newJoinToken makes a token for the CA pinned by pin.
func newJoinToken(pin string) (joinToken, error) {
	b := make([]byte, 22)
	if _, err := rand.Read(b); err != nil {
		return joinToken{}, err
	}
	for i := range b {
		// 256 = 7*36 + 4: a bias of under 2% on four letters, as in
		// kubeadm's generator; 82 bits either way.
		b[i] = tokenAlphabet[int(b[i])%len(tokenAlphabet)]
	}
	return joinToken{Pin: pin, ID: string(b[:6]), Secret: string(b[6:])}, nil
}

func secretHash(secret string) []byte {
	sum := sha256.Sum256([]byte(secret))
	return sum[:]
}

// initCluster makes a new cluster's credentials for node name (key
// nodeKey) and writes them into dataDir. It refuses a data dir that
// already holds credentials.
func initCluster(dataDir, name string, nodeKey ed25519.PrivateKey, ips []netip.Addr, now time.Time) (*credentials, error) {
	if _, err := os.Stat(filepath.Join(dataDir, caCertFile)); err == nil {
		return nil, fmt.Errorf("%s already belongs to a cluster (%s exists); use another --data-dir", dataDir, caCertFile)
	}
	ca, caKey, err := newCA(now)
	if err != nil {
		return nil, fmt.Errorf("make cluster CA: %w", err)
	}
	cert, err := issueNodeCert(ca, caKey, name, nodeKey.Public().(ed25519.PublicKey), ips, now)
	if err != nil {
		return nil, err
	}
	gk := make([]byte, 32)
	if _, err := rand.Read(gk); err != nil {
		return nil, err
	}
	creds := &credentials{CA: ca, CAKey: caKey, NodeCert: cert, GossipKeys: [][]byte{gk}}
	return creds, saveCredentials(dataDir, creds)
}

// InitCluster is `starling init`: it makes the node key (if there is none)
// and a new cluster's CA, gossip key and this node's certificate in
// dataDir, and returns the CA pin. The agent started on dataDir is the
// cluster's first node; 'starling join-token' then invites others.
func InitCluster(dataDir, name string) (pin string, err error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("--data-dir %s: %w", dataDir, err)
	}
	key, err := loadOrCreateNodeKey(dataDir)
	if err != nil {
		return "", err
	}
	creds, err := initCluster(dataDir, name, key, nil, time.Now())
	if err != nil {
		return "", err
	}
	return caPin(creds.CA), nil
}
