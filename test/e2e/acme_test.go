package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/placement"
	"github.com/starling-orchestrator/starling/test/harness"
)

// pebbleTool is the ACME test server, built once per machine.
const pebbleTool = "github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.3"

// serverFiles writes a certificate for ip signed by ca, its key, and
// ca's certificate to dir: cert.pem, key.pem, ca.pem.
func (ca *testCA) serverFiles(t *testing.T, dir string, ip string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: ip}, IPAddresses: []net.IP{net.ParseIP(ip)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	for name, b := range map[string][]byte{
		"cert.pem": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"key.pem":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
		"ca.pem":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// startPebble runs the ACME test server in the LAN namespace on
// LANPrefix.254:14000, validating HTTP-01 on port 80 of the address
// names resolve to (a resolver of its own: every name is ip).
func startPebble(t *testing.T, c *harness.Cluster, dir, ip string) {
	t.Helper()
	bin, err := harness.GoTool(context.Background(), pebbleTool)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := harness.ListenPacketIn(c.LAN, harness.LANPrefix+".254:53")
	if err != nil {
		t.Fatal(err)
	}
	l, err := harness.ListenIn(c.LAN, harness.LANPrefix+".254:53") // pebble asks over TCP
	if err != nil {
		t.Fatal(err)
	}
	answer := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if q := r.Question[0]; q.Qtype == dns.TypeA {
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(ip)}}
		}
		w.WriteMsg(m)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: answer}, {Listener: l, Handler: answer}} {
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
	}
	cfg := fmt.Sprintf(`{"pebble": {"listenAddress": "%s.254:14000", "managementListenAddress": "%s.254:15000",
  "certificate": "%s/cert.pem", "privateKey": "%s/key.pem", "httpPort": 80, "tlsPort": 443, "ocspResponderURL": "",
  "externalAccountBindingRequired": false, "retryAfter": {"authz": 1, "order": 1}}}`, harness.LANPrefix, harness.LANPrefix, dir, dir)
	if err := os.WriteFile(filepath.Join(dir, "pebble.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "pebble.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net=/run/netns/"+c.LAN, bin, "-config", filepath.Join(dir, "pebble.json"), "-dnsserver", harness.LANPrefix+".254:53")
	// No random sleeps before validation, no random nonce rejections.
	cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "pebble.log"))
			t.Logf("pebble's log:\n%s", b)
		}
	})
}

// TestIngressCertificateFromACME: an Ingress annotated
// kubernetes.io/tls-acme gets its certificate from an ACME server
// (pebble in the LAN namespace) through HTTP-01, ordered once for the
// cluster by the node hashing picks; the challenge is answered by the
// other node, where the name leads; both nodes then serve the same
// certificate, kept as the Secret the Ingress names.
func TestIngressCertificateFromACME(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	dir := t.TempDir()
	ca.serverFiles(t, dir, harness.LANPrefix+".254")
	c := newCluster(t, 2, "--acme-directory", "https://"+harness.LANPrefix+".254:14000/dir", "--acme-ca", filepath.Join(dir, "ca.pem"))
	n1, n2 := c.Nodes[0], c.Nodes[1]
	const ns = "acme-e2e"
	owner := placement.Rank([]placement.Node{{Name: n1.Name}, {Name: n2.Name}}, "acme/"+ns+"/site-tls", 0)[0]
	other := n1
	if owner == n1.Name {
		other = n2
	}
	startPebble(t, c, dir, other.IP)
	importEcho(t, c.Nodes...)
	waitReadyNodes(t, n1, 2)
	site := echoApp("site", 1, "site")
	site.Namespace = ns
	apply(t, n1, site.Deployment()+"---\n"+site.Service("site", []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}})+`---
apiVersion: v1
kind: Secret
metadata: {name: mine, namespace: `+ns+`}
stringData: {password: hunter2}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: site
  namespace: `+ns+`
  annotations: {kubernetes.io/tls-acme: "true"}
spec:
  tls: [{hosts: [site.test], secretName: site-tls}, {hosts: [mine.test], secretName: mine}]
  rules:
  - host: site.test
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: site, port: {number: 80}}}}
`)
	waitRunning(t, n1, "site", 1, 90*time.Second)
	serials := map[string]string{}
	for _, n := range c.Nodes {
		dial := harness.DialIn(c.LAN)
		if _, err := eventually(120*time.Second, func() error {
			conn, err := dial(context.Background(), "tcp", n.IP+":443")
			if err != nil {
				return err
			}
			tc := tls.Client(conn, &tls.Config{ServerName: "site.test", InsecureSkipVerify: true})
			defer tc.Close()
			if err := tc.Handshake(); err != nil {
				return err
			}
			leaf := tc.ConnectionState().PeerCertificates[0]
			if !strings.HasPrefix(leaf.Issuer.CommonName, "Pebble") || leaf.VerifyHostname("site.test") != nil {
				return fmt.Errorf("via %s: certificate for %v issued by %q, want pebble's for site.test", n.Name, leaf.DNSNames, leaf.Issuer.CommonName)
			}
			serials[n.Name] = leaf.SerialNumber.String()
			fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n")
			b, _ := io.ReadAll(tc)
			if !strings.Contains(string(b), "message=site") {
				return fmt.Errorf("via %s: %q", n.Name, b)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if serials[n1.Name] != serials[n2.Name] {
		t.Errorf("the nodes serve different certificates: %v (one order for the cluster, one Secret)", serials)
	}
	if out, err := n1.CLI("describe", "ingress", "site", "-n", ns); err != nil || !strings.Contains(out, "certificate: site.test, issued by \"Pebble") {
		t.Errorf("describe ingress site: %v\n%s", err, out)
	}
	out, err := n2.CLI("get", "secret", "site-tls", "-n", ns)
	if err != nil || !strings.Contains(out, "kubernetes.io/tls") {
		t.Errorf("get secret site-tls: %v\n%s", err, out)
	}
	if _, err := eventually(20*time.Second, func() error {
		out, err := n1.CLI("get", "configmaps", "-n", "starling-system")
		if err != nil || strings.Contains(out, "acme-http01-") {
			return fmt.Errorf("challenges left behind: %v\n%s", err, out)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	// A Secret a user made is never replaced by a certificate.
	if _, err := eventually(30*time.Second, func() error {
		for _, n := range c.Nodes {
			if strings.Contains(n.Tail(200), "Secret "+ns+"/mine exists and was not made by ACME") {
				return nil
			}
		}
		return fmt.Errorf("no node said it will not replace Secret mine")
	}); err != nil {
		t.Error(err)
	}
	if out, err := n1.CLI("get", "secret", "mine", "-n", ns, "-o", "json", "--reveal"); err != nil || !strings.Contains(out, `"password"`) || strings.Contains(out, "tls.crt") {
		t.Errorf("the user's Secret mine: %v\n%s", err, out)
	}
	// A Secret a user made is never replaced by a certificate.
	if _, err := eventually(30*time.Second, func() error {
		for _, n := range c.Nodes {
			if strings.Contains(n.Tail(200), "Secret "+ns+"/mine exists and was not made by ACME") {
				return nil
			}
		}
		return fmt.Errorf("no node said it will not replace Secret mine")
	}); err != nil {
		t.Error(err)
	}
	if out, err := n1.CLI("get", "secret", "mine", "-n", ns, "-o", "json", "--reveal"); err != nil || !strings.Contains(out, `"password"`) || strings.Contains(out, "tls.crt") {
		t.Errorf("the user's Secret mine: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "pebble.log"))
	if n := strings.Count(string(b), "Issued certificate serial"); n != 1 {
		t.Errorf("pebble issued %d certificates, want 1 (once for the cluster)", n)
	}
}
