package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/test/harness"
)

// testCA issues certificates for the Ingress tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ingress test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// secret is a kubernetes.io/tls Secret manifest for host, with serial.
func (ca *testCA) secret(t *testing.T, ns, name, host string, serial int64) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	b64 := func(typ string, b []byte) string {
		return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}))
	}
	return fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata: {name: %s, namespace: %s}\ntype: kubernetes.io/tls\ndata:\n  tls.crt: %s\n  tls.key: %s\n",
		name, ns, b64("CERTIFICATE", der), b64("EC PRIVATE KEY", kder))
}

// lanClient is an HTTP client in the LAN namespace that connects every
// request to node (curl --resolve HOST:PORT:NODE), trusting ca.
func lanClient(c *harness.Cluster, node *harness.Node, ca *testCA) *http.Client {
	dial := harness.DialIn(c.LAN)
	return &http.Client{
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				_, port, _ := net.SplitHostPort(addr)
				return dial(ctx, network, net.JoinHostPort(node.IP, port))
			},
			TLSClientConfig:   &tls.Config{RootCAs: ca.pool},
			ForceAttemptHTTP2: true,
		},
	}
}

// TestIngressRoutesByHostAndPathOnEveryNode: from the LAN, each node
// serves the Ingresses: plain HTTP to a TLS host is redirected to
// HTTPS; over TLS (HTTP/2) the certificate is the one SNI names, and
// paths go to their Services; a backend with no ready endpoint answers
// 503. A WebSocket opened through a node keeps working across a change
// of its Ingress and of its certificate, and the next handshake shows
// the new certificate. get and describe show the Ingress.
func TestIngressRoutesByHostAndPathOnEveryNode(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	n1 := c.Nodes[0]
	importEcho(t, c.Nodes...)
	waitReadyNodes(t, n1, 2)
	const ns = "ingress-e2e"
	ca := newTestCA(t)
	web, api, idle := echoApp("web", 2, "web"), echoApp("api", 1, "api"), echoApp("idle", 0, "idle")
	web.Namespace, api.Namespace, idle.Namespace = ns, ns, ns
	http80 := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}
	ingress := func(extra string) string {
		return `apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop, namespace: ` + ns + `}
spec:
  tls: [{hosts: [shop.test], secretName: shop-tls}, {hosts: [api.test], secretName: api-tls}]
  rules:
  - host: shop.test
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
      - {path: /api, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}
      - {path: /idle, pathType: Exact, backend: {service: {name: idle, port: {number: 80}}}}` + extra + `
  - host: api.test
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}
`
	}
	apply(t, n1, web.Deployment()+"---\n"+web.Service("web", http80)+"---\n"+api.Deployment()+"---\n"+api.Service("api", http80)+"---\n"+
		idle.Deployment()+"---\n"+idle.Service("idle", http80)+"---\n"+
		ca.secret(t, ns, "shop-tls", "shop.test", 100)+"---\n"+ca.secret(t, ns, "api-tls", "api.test", 200)+"---\n"+ingress(""))
	waitRunning(t, n1, "web", 2, 90*time.Second)
	waitRunning(t, n1, "api", 1, 90*time.Second)

	get := func(cl *http.Client, url string) (int, string, *http.Response, error) {
		resp, err := cl.Get(url)
		if err != nil {
			return 0, "", nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp, nil
	}
	for _, n := range c.Nodes {
		cl := lanClient(c, n, ca)
		for _, check := range []struct {
			url, want string
			code      int
		}{
			{"https://shop.test/", "message=web", 200},
			{"https://shop.test/cart?x=1", "message=web", 200},
			{"https://shop.test/api/v1", "message=api", 200},
			{"https://api.test/", "message=api", 200},
			{"https://shop.test/idle", "503 Service Unavailable: no ready endpoint serves this path", 503},
			{"https://shop.test/api/../admin", "", 400},
			{"http://shop.test/cart?x=1", "", 308},
			{"https://nosuch.test/", "", 0}, // the default certificate: not trusted
		} {
			var code int
			var body string
			var resp *http.Response
			if _, err := eventually(30*time.Second, func() error {
				var err error
				code, body, resp, err = get(cl, check.url)
				if check.code == 0 {
					if err == nil || !strings.Contains(err.Error(), "certificate") {
						return fmt.Errorf("%s: got %d, %v; want a certificate error", check.url, code, err)
					}
					return nil
				}
				if err != nil || code != check.code || !strings.Contains(body, check.want) {
					return fmt.Errorf("via %s %s: %d %q %v", n.Name, check.url, code, body, err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			switch {
			case check.code == 308 && resp.Header.Get("Location") != "https://shop.test/cart?x=1":
				t.Errorf("redirect to %q", resp.Header.Get("Location"))
			case strings.HasPrefix(check.url, "https://shop.test/") && check.code == 200:
				if resp.ProtoMajor != 2 || resp.TLS.PeerCertificates[0].Subject.CommonName != "shop.test" {
					t.Errorf("via %s: %s over %s, certificate %q", n.Name, check.url, resp.Proto, resp.TLS.PeerCertificates[0].Subject.CommonName)
				}
			case check.url == "https://api.test/" && resp.TLS.PeerCertificates[0].SerialNumber.Int64() != 200:
				t.Errorf("SNI api.test: certificate serial %d", resp.TLS.PeerCertificates[0].SerialNumber)
			}
		}
	}

	// A WebSocket through n1, kept across a config and a certificate change.
	cl := lanClient(c, n1, ca)
	cl.Timeout = 0
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "wss://shop.test/ws", &websocket.DialOptions{HTTPClient: cl})
	if err != nil {
		t.Fatalf("websocket: %v", err)
	}
	defer ws.CloseNow()
	echo := func(msg string) {
		t.Helper()
		if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatalf("websocket write %q: %v", msg, err)
		}
		_, got, err := ws.Read(ctx)
		if err != nil || !strings.HasSuffix(string(got), ": "+msg) || !strings.HasPrefix(string(got), "web-") {
			t.Fatalf("websocket echo of %q: %q %v", msg, got, err)
		}
	}
	echo("before")
	apply(t, n1, ingress("\n      - {path: /new, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}")+"---\n"+ca.secret(t, ns, "shop-tls", "shop.test", 101))
	fresh := lanClient(c, n1, ca)
	if _, err := eventually(20*time.Second, func() error {
		fresh.CloseIdleConnections()
		code, body, resp, err := get(fresh, "https://shop.test/new")
		if err != nil || code != 200 || !strings.Contains(body, "message=api") || resp.TLS.PeerCertificates[0].SerialNumber.Int64() != 101 {
			return fmt.Errorf("after the change: %d %q %v", code, body, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	echo("after") // the connection opened before both changes still echoes

	out, err := n1.CLI("get", "ingress", "-n", ns)
	if err != nil || !strings.Contains(out, "shop.test,api.test") || !strings.Contains(out, c.Nodes[0].IP) || !strings.Contains(out, "80, 443") {
		t.Errorf("get ingress: %v\n%s", err, out)
	}
	out, err = n1.CLI("describe", "ingress", "shop", "-n", ns)
	if err != nil || !strings.Contains(out, "shop-tls terminates shop.test") || !strings.Contains(out, "idle:80 (<no ready endpoint>)") ||
		strings.Count(out, ":8080") < 3 {
		t.Errorf("describe ingress: %v\n%s", err, out)
	}
}
