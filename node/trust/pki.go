package trust

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
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/member"
)

// The cluster's public-key infrastructure. `starling init` (or the first
// agent, started with no --join) makes a certificate authority (an
// Ed25519 key and a self-signed certificate) and the gossip key.
//
// No node needs the CA key, and a node that joins never receives it: a
// node is invited where the operator keeps the CA key ('starling
// join-token NAME', see invitation), as Nebula's nebula-cert signs each
// host's certificate on the CA's machine. The invitation holds the new
// node's key and its certificate for NAME; a member admits it (the peer
// port's POST /v1/join) when that certificate chains to the CA, the
// joiner proves it holds the key, the invitation's join deadline has not
// passed and the name is free; the member answers with the gossip keys
// only. So one compromised node (its files, its API token, its gossip
// key) cannot add a node or give a name a key of its choosing: both need
// a certificate only the CA key can make, and a name keeps the first key
// the cluster saw for it (identity.go). The first agent of a cluster made
// without 'starling init' keeps the CA key in its data dir, and warns at
// every start until the operator moves it off (docs/real-hosts.md).
//
// Files in --data-dir (all 0600):
//
//	ca.crt      the CA certificate (PEM)
//	ca.key      the CA private key (PEM, PKCS #8): only on a cluster's
//	            first node made without 'starling init', until moved
//	node.crt    this node's certificate (PEM), for its node.key
//	gossip.key  the 32-byte gossip key, base64
//
// 'starling init' writes ca.crt and ca.key into its --ca-dir instead
// (DefaultCADir), and the node's files into --data-dir.
const (
	CaCertFile    = "ca.crt"
	CaKeyFile     = "ca.key"
	NodeCertFile  = "node.crt"
	GossipKeyFile = "gossip.key"
)

// Certificate lifetimes. A node certificate is valid as long as the CA
// that issued it: no node holds the CA key to renew it, and a node's
// identity is ended by revoking its key ('starling node forget'), not by
// expiry. Nodes that still hold the CA key (clusters made before
// invitations) renew theirs to that lifetime (RenewNodeCert).
const (
	caValidity = 10 * 365 * 24 * time.Hour
	// NodeCertRenewBefore: a node that holds the CA key renews its
	// certificate once it ends this much before the CA does.
	NodeCertRenewBefore = 30 * 24 * time.Hour
	// certBackdate allows for clocks a little behind the issuer's.
	certBackdate = 5 * time.Minute
)

// Credentials are what makes a node a member of a secure cluster.
type Credentials struct {
	CA *x509.Certificate
	// CAKey is nil on a node that does not hold the CA key (every node
	// but one made without 'starling init', and that one once the key is
	// moved off).
	CAKey    ed25519.PrivateKey
	NodeCert *x509.Certificate
	// GossipKeys are the gossip keys (32 bytes, AES-256-GCM, memberlist's
	// Keyring), the one in use first; more than one during a rotation.
	GossipKeys [][]byte
}

// CaPin is the pin of a CA certificate: the hex SHA-256 of its
// SubjectPublicKeyInfo (64 hex digits).
func CaPin(ca *x509.Certificate) string { return SpkiPin(ca) }

// NewCA makes a CA key and its self-signed certificate (caValidity).
func NewCA(now time.Time) (*x509.Certificate, ed25519.PrivateKey, error) {
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
		Subject:               pkix.Name{CommonName: "starling cluster CA " + member.KeyID(pub)},
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

// SignNodeCert issues the certificate of node name for its key pub,
// valid from now until the CA expires, for both TLS ends (server and
// client), with ips (the node's addresses) as IP SANs. A non-zero joinBy
// is the invitation's join deadline (JoinDeadline).
func SignNodeCert(ca *x509.Certificate, caKey ed25519.PrivateKey, name string, pub ed25519.PublicKey, ips []netip.Addr, now, joinBy time.Time) (*x509.Certificate, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name, Organization: []string{"starling-node"}},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-certBackdate),
		NotAfter:     ca.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if !joinBy.IsZero() {
		tmpl.Subject.OrganizationalUnit = []string{joinByPrefix + joinBy.UTC().Format(time.RFC3339)}
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

// VerifyNodeCert checks that cert was issued by ca for node name and key
// pub and is valid at now.
func VerifyNodeCert(cert, ca *x509.Certificate, name string, pub []byte, now time.Time) error {
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
		return fmt.Errorf("certificate of %q is for key %s, not the record's signer %s", name, member.KeyID(certKey), member.KeyID(pub))
	}
	return nil
}

// CertCache remembers node certificates that verified, so that the
// certificate every status record carries costs one map lookup after the
// first: the key is the SHA-256 of (certificate DER, name, signer), the
// value the certificate's NotAfter. Bounded: cleared when full.
type CertCache struct {
	ca *x509.Certificate
	mu sync.Mutex
	ok map[[32]byte]time.Time
}

const maxCertCache = 4096

func NewCertCache(ca *x509.Certificate) *CertCache {
	return &CertCache{ca: ca, ok: map[[32]byte]time.Time{}}
}

// Verify checks the DER certificate der for node name and key pub.
func (c *CertCache) Verify(der []byte, name string, pub []byte, now time.Time) error {
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
	if err := VerifyNodeCert(cert, c.ca, name, pub, now); err != nil {
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

// CreateCluster makes a new cluster's credentials for node name (key
// nodeKey): the CA into caDir, the node's certificate and the gossip key
// into DataDir (caDir may be DataDir). It refuses a data dir that already
// holds credentials, and a CA dir that already holds a CA.
func CreateCluster(dataDir, caDir, name string, nodeKey ed25519.PrivateKey, ips []netip.Addr, now time.Time) (*Credentials, error) {
	for _, d := range []string{dataDir, caDir} {
		if _, err := os.Stat(filepath.Join(d, CaCertFile)); err == nil {
			return nil, fmt.Errorf("%s already belongs to a cluster (%s exists); use another directory", d, CaCertFile)
		}
	}
	ca, caKey, err := NewCA(now)
	if err != nil {
		return nil, fmt.Errorf("make cluster CA: %w", err)
	}
	cert, err := SignNodeCert(ca, caKey, name, nodeKey.Public().(ed25519.PublicKey), ips, now, time.Time{})
	if err != nil {
		return nil, err
	}
	gk := make([]byte, 32)
	if _, err := rand.Read(gk); err != nil {
		return nil, err
	}
	if caDir != dataDir {
		if err := saveCA(caDir, ca, caKey); err != nil {
			return nil, err
		}
		creds := &Credentials{CA: ca, NodeCert: cert, GossipKeys: [][]byte{gk}}
		return creds, saveCredentials(dataDir, creds)
	}
	creds := &Credentials{CA: ca, CAKey: caKey, NodeCert: cert, GossipKeys: [][]byte{gk}}
	return creds, saveCredentials(dataDir, creds)
}

// DefaultCADir is where 'starling init' keeps the CA and 'starling
// join-token' looks for it first: $STARLING_CA_DIR, else ~/.starling/ca.
func DefaultCADir() string {
	if d := os.Getenv("STARLING_CA_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "/root/.starling/ca"
	}
	return filepath.Join(home, ".starling", "ca")
}

// InitCluster is `starling init`: it makes the node key (if there is none)
// and a new cluster's CA (into caDir, 0700), gossip key and this node's
// certificate (into DataDir), and returns the CA pin. The agent started
// on DataDir is the cluster's first node; 'starling join-token NAME',
// run where caDir is, invites others.
func InitCluster(dataDir, caDir, name string) (pin string, err error) {
	for flag, d := range map[string]string{"--data-dir": dataDir, "--ca-dir": caDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", fmt.Errorf("%s %s: %w", flag, d, err)
		}
	}
	key, err := LoadOrCreateNodeKey(dataDir)
	if err != nil {
		return "", err
	}
	creds, err := CreateCluster(dataDir, caDir, name, key, nil, time.Now())
	if err != nil {
		return "", err
	}
	return CaPin(creds.CA), nil
}
