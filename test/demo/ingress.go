package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// ingressHost is examples/hello/ingress.yaml's host.
const ingressHost = "hello.example.test"

// ingressTLS makes a demo CA and a certificate for ingressHost, stores
// them as the Secret hello-tls with 'starling create secret tls', and
// requests https://hello.example.test/ from the LAN through each node,
// trusting only the demo CA (curl --resolve, in Go), after the plain
// HTTP request that is redirected there.
func (s *scenario) ingressTLS() error {
	n1 := s.c.Nodes[0]
	crt, key, pool, err := demoCertificate(s.dir, ingressHost)
	if err != nil {
		return err
	}
	s.r.say(`examples/hello/ingress.yaml (applied with the rest) routes %s to the hello
Service on every node's ports 80 and 443, its certificate the Secret hello-tls.
A demo CA signs a certificate for the host; the Secret is made from it:`, ingressHost)
	if _, err := s.r.run(n1, "create", "secret", "tls", "hello-tls", "--cert", crt, "--key", key); err != nil {
		return err
	}
	s.r.say("From the LAN namespace, as 'curl --resolve %s:443:NODE --cacert demo-ca.crt https://%s/':", ingressHost, ingressHost)
	for _, n := range s.c.Nodes {
		cl := resolveTo(s.c.LAN, n.IP, pool)
		var line string
		if _, err := harness.Poll(context.Background(), 200*time.Millisecond, 30*time.Second, func() error {
			resp, err := cl.Get("http://" + ingressHost + "/")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusPermanentRedirect {
				return fmt.Errorf("http://%s/ via %s: %s, want a redirect to HTTPS", ingressHost, n.Name, resp.Status)
			}
			loc := resp.Header.Get("Location")
			resp, err = cl.Get(loc)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.TLS == nil {
				return fmt.Errorf("%s via %s: %s", loc, n.Name, resp.Status)
			}
			a := parseAnswer(string(body))
			line = fmt.Sprintf("via %s: http:// -> %d %s; %s %s, certificate %q (demo CA), answered by %s (%s)", n.Name, http.StatusPermanentRedirect, loc,
				resp.Proto, resp.Status, resp.TLS.PeerCertificates[0].Subject.CommonName, a.hostname, s.nodeOf(a.hostname))
			return nil
		}); err != nil {
			return err
		}
		s.r.say("%s", line)
	}
	_, err = s.r.run(n1, "get", "ingress")
	return err
}

// resolveTo is an HTTP client in the LAN namespace that connects every
// request to ip, whatever its host (curl --resolve), trusting pool, and
// does not follow redirects.
func resolveTo(lan, ip string, pool *x509.CertPool) *http.Client {
	dial := harness.DialIn(lan)
	return &http.Client{
		Timeout:       5 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				_, port, _ := net.SplitHostPort(addr)
				return dial(ctx, network, net.JoinHostPort(ip, port))
			},
			TLSClientConfig:   &tls.Config{RootCAs: pool},
			ForceAttemptHTTP2: true,
		},
	}
}

// demoCertificate writes a CA and a certificate for host signed by it
// to dir (demo-ca.crt, host.crt, host.key) and returns the last two
// paths and a pool of the CA.
func demoCertificate(dir, host string) (crtPath, keyPath string, pool *x509.CertPool, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Starling demo CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", nil, err
	}
	crtPath, keyPath = filepath.Join(dir, host+".crt"), filepath.Join(dir, host+".key")
	write := func(path, typ string, b []byte, mode os.FileMode) error {
		return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), mode)
	}
	if err := errors.Join(write(filepath.Join(dir, "demo-ca.crt"), "CERTIFICATE", caDER, 0o644), write(crtPath, "CERTIFICATE", der, 0o644),
		write(keyPath, "EC PRIVATE KEY", kder, 0o600)); err != nil {
		return "", "", nil, err
	}
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return crtPath, keyPath, pool, nil
}
