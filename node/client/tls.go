package client

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// PinnedTLS is a TLS client configuration that accepts a server whose
// certificate chain holds the CA pinned by the CA pin (64 hex digits: the
// SHA-256 of its SubjectPublicKeyInfo) and whose own certificate that CA
// issued. With serverPin (the SHA-256 of the server certificate's
// SubjectPublicKeyInfo, i.e. of the node's key, which renewals keep) it
// accepts only that node: every node holds the CA key, so a chain to the
// CA proves only "some node of the cluster". A joining node knows the CA
// pin alone (any node may admit it and learns nothing secret from it);
// the CLI's client config holds both, since it sends the API token.
// A refused server fails the handshake with an error wrapping
// ErrPinMismatch (not of the cluster) or ErrServerPin (another node).
func PinnedTLS(caPin, serverPin string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Verification is VerifyPeerCertificate's: the CA is not known
		// in advance, only its pin.
		InsecureSkipVerify: true, //nolint:gosec
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) < 2 {
				return errors.New("the server sent no CA certificate")
			}
			leaf, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			for _, b := range raw[1:] {
				ca, err := x509.ParseCertificate(b)
				if err != nil || !ca.IsCA || !PinMatches(ca.RawSubjectPublicKeyInfo, caPin) {
					continue
				}
				pool := x509.NewCertPool()
				pool.AddCert(ca)
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
					return err
				}
				if serverPin != "" && !PinMatches(leaf.RawSubjectPublicKeyInfo, serverPin) {
					return fmt.Errorf("%w: the server is node %q, not the node the client config was written for (write one for it with 'starling config' on that node)", ErrServerPin, printable(leaf.Subject.CommonName))
				}
				return nil
			}
			return ErrPinMismatch
		},
	}
}

// ErrServerPin: the server is a node of the cluster, but not the pinned
// one.
var ErrServerPin = errors.New("the server's key is not the pinned one")

// ErrPinMismatch: the server's certificate does not chain to the pinned
// CA: the address is not a node of the token's (or client config's)
// cluster.
var ErrPinMismatch = errors.New("the server's certificate does not chain to the pinned cluster CA (the join token's or the client config's): it is not a node of that cluster, or someone is in the way")

// PinMatches reports whether the SHA-256 of spki is pin (hex), in
// constant time.
func PinMatches(spki []byte, pin string) bool {
	sum := sha256.Sum256(spki)
	return subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(pin)) == 1
}

// printable is s with control characters replaced (a certificate's name
// is the server's word).
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
}
