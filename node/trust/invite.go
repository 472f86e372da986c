package trust

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Invitations (join tokens), made where the CA key is kept:
//
//	SLTKN-2-<CA pin, 64 hex digits>-<certificate, DER, base64url>.<key seed, base64url>
//
// The certificate is the new node's, for its name and the key whose
// 32-byte Ed25519 seed follows, and says by when the node must join
// (JoinDeadline). The pin lets the node check it talks to this cluster;
// the key proves to the member it asks that it is the node the CA
// invited, without sending the key: the joiner signs its request
// (JoinSigningBytes). Anyone who holds the token can be that node (the
// token is its key): keep it like a password, and it admits only until
// its deadline. Version 1 tokens (SLTKN-1-..., a secret that any node
// checked, the node then issuing the certificate with its own copy of
// the CA key) are refused with a message naming the new command.
const (
	tokenPrefix   = "SLTKN-2-"
	tokenPrefixV1 = "SLTKN-1-"
	// joinByPrefix starts the certificate's organizational unit that
	// holds an invitation's join deadline (RFC 3339, UTC).
	joinByPrefix = "starling join by "
)

var tokenRE = regexp.MustCompile(`^SLTKN-2-([0-9a-f]{64})-([A-Za-z0-9_-]{100,1000})\.([A-Za-z0-9_-]{43})$`)

// Invitation is a parsed join token: the CA pin, the invited node's
// certificate and key.
type Invitation struct {
	Pin  string // hex SHA-256 of the CA's SubjectPublicKeyInfo
	Cert *x509.Certificate
	Key  ed25519.PrivateKey
}

// Name is the invited node's name.
func (inv Invitation) Name() string { return inv.Cert.Subject.CommonName }

func (inv Invitation) String() string {
	b64 := base64.RawURLEncoding
	return tokenPrefix + inv.Pin + "-" + b64.EncodeToString(inv.Cert.Raw) + "." + b64.EncodeToString(inv.Key.Seed())
}

// errTokenV1 is the refusal of a version 1 join token.
var errTokenV1 = errors.New("this join token is of an older kind, which needed the CA key on every node; make an invitation for the node where the cluster's CA key is kept: 'starling join-token NODE-NAME' (docs/real-hosts.md, \"Cluster, invitations and API token\")")

// ReadInvitation parses a token as 'starling join-token' prints it: the
// certificate must parse and be for the key that follows.
func ReadInvitation(s string) (Invitation, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, tokenPrefixV1) {
		return Invitation{}, errTokenV1
	}
	m := tokenRE.FindStringSubmatch(s)
	if m == nil {
		return Invitation{}, errors.New("not a join token (want SLTKN-2-<64 hex digits>-<certificate>.<key>, as 'starling join-token NODE-NAME' prints it)")
	}
	b64 := base64.RawURLEncoding
	der, err := b64.DecodeString(m[2])
	if err != nil {
		return Invitation{}, fmt.Errorf("join token: certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return Invitation{}, fmt.Errorf("join token: certificate: %w", err)
	}
	seed, err := b64.DecodeString(m[3])
	if err != nil || len(seed) != ed25519.SeedSize {
		return Invitation{}, errors.New("join token: the key is not a 32-byte seed")
	}
	key := ed25519.NewKeyFromSeed(seed)
	if pub, ok := cert.PublicKey.(ed25519.PublicKey); !ok || !pub.Equal(key.Public()) {
		return Invitation{}, errors.New("join token: the certificate is not for the key it carries (was the token cut or pasted together?)")
	}
	return Invitation{Pin: m[1], Cert: cert, Key: key}, nil
}

// Bounds of an invitation's lifetime (the time to join).
const (
	DefaultJoinTokenTTL = 24 * time.Hour
	MaxJoinTokenTTL     = 365 * 24 * time.Hour
)

// NewInvitation makes node name's key and certificate with the CA key;
// the node must join within ttl of now.
func NewInvitation(ca *x509.Certificate, caKey ed25519.PrivateKey, name string, ttl time.Duration, now time.Time) (Invitation, error) {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return Invitation{}, fmt.Errorf("node name %q: %s (a DNS label such as node-1: the agent's --name)", name, strings.Join(errs, "; "))
	}
	if ttl < time.Minute || ttl > MaxJoinTokenTTL {
		return Invitation{}, fmt.Errorf("--ttl %s: must be between 1m and %s (units: s, m, h; e.g. 24h)", ttl, MaxJoinTokenTTL)
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Invitation{}, err
	}
	cert, err := SignNodeCert(ca, caKey, name, pub, nil, now, now.Add(ttl).Truncate(time.Second))
	if err != nil {
		return Invitation{}, err
	}
	return Invitation{Pin: CaPin(ca), Cert: cert, Key: key}, nil
}

// JoinDeadline is the join deadline an invitation's certificate carries;
// ok is false for a certificate that carries none (issued to a node that
// had joined, or by a build before invitations): such a certificate
// admits no new node.
func JoinDeadline(cert *x509.Certificate) (time.Time, bool) {
	for _, ou := range cert.Subject.OrganizationalUnit {
		if rest, ok := strings.CutPrefix(ou, joinByPrefix); ok {
			t, err := time.Parse(time.RFC3339, rest)
			return t, err == nil
		}
	}
	return time.Time{}, false
}

// JoinSigningBytes is what a joining node signs with its key: a domain
// string, its name, the SHA-256 of the certificate it presents, the pin
// of the member it asks (the SHA-256 of that member's certificate's
// SubjectPublicKeyInfo, which the joiner learned in a TLS handshake with
// it), and the request time (Unix seconds), which the member checks
// against its own clock (peerAuthSkew). A request is good only at the
// member it was meant for, and only for a minute: a node that took it
// (any holder of a certificate of the cluster, a forgotten node's too)
// cannot relay it to another member for the gossip keys.
func JoinSigningBytes(name string, cert []byte, server string, unix int64) []byte {
	sum := sha256.Sum256(cert)
	return fmt.Appendf(nil, "starling join v2\x00%s\x00%x\x00%s\x00%d", name, sum, server, unix)
}

// forgetSkew is how much earlier than a 'node forget' an invitation may
// say it was made and still count as made after it: the forget's time is
// the forgetting node's clock, the invitation's the CA machine's. Kept
// small: an invitation made this long before a forget survives it, and a
// CA machine whose clock is further behind gets a refusal that gives
// both times.
const forgetSkew = 5 * time.Second

// MadeBeforeForget reports whether a certificate issued at issued (its
// NotBefore plus certBackdate) predates the last forget of its name
// (forgotten), clocks forgetSkew apart allowed for.
func MadeBeforeForget(cert *x509.Certificate, forgotten time.Time) bool {
	return cert.NotBefore.Add(certBackdate).Before(forgotten.Add(-forgetSkew))
}

// MakeInvitation is 'starling join-token NAME': an invitation for node
// name, made with the CA in caDir (files ca.crt and ca.key), valid ttl.
func MakeInvitation(caDir, name string, ttl time.Duration) (token string, joinBy time.Time, err error) {
	ca, caKey, err := loadCA(caDir)
	if err != nil {
		return "", time.Time{}, err
	}
	inv, err := NewInvitation(ca, caKey, name, ttl, time.Now())
	if err != nil {
		return "", time.Time{}, err
	}
	by, _ := JoinDeadline(inv.Cert)
	return inv.String(), by, nil
}

// HoldsCAKey reports whether dir holds a CA key file.
func HoldsCAKey(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, CaKeyFile))
	return err == nil
}

// ParseInvitation parses a join token as 'starling join-token' prints it
// into the invited node's name, key and certificate (DER); for tools and
// tests.
func ParseInvitation(s string) (name string, key ed25519.PrivateKey, cert []byte, err error) {
	inv, err := ReadInvitation(s)
	if err != nil {
		return "", nil, nil, err
	}
	return inv.Name(), inv.Key, inv.Cert.Raw, nil
}
