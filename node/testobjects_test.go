package node

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/trust"
	"github.com/starling-orchestrator/starling/test/harness"
)

// Shared helpers of the package's tests: the objects they apply, built
// with test/harness's manifest builder and parsed as an applied file is,
// and the setup several tests repeat.

// parseOne returns the one object of the manifest y, as manifest.Parse
// reads an applied file.
func parseOne(y string) (manifest.Object, error) {
	objs, err := manifest.Parse([]byte(y), "test")
	if err != nil || len(objs) != 1 {
		return manifest.Object{}, fmt.Errorf("parse: %d objects, %v", len(objs), err)
	}
	return objs[0], nil
}

func mustParse(t testing.TB, y string) manifest.Object {
	t.Helper()
	o, err := parseOne(y)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func mustEncode(t testing.TB, y string) []byte {
	t.Helper()
	b, err := manifest.Encode(mustParse(t, y))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testDeployment is app's Deployment, after edits, parsed.
func testDeployment(t testing.TB, app harness.App, edits ...func(*appsv1.Deployment)) manifest.Object {
	t.Helper()
	return mustParse(t, app.Deployment(edits...))
}

// testService is Service name selecting app's pods, with ports, after
// edits, parsed.
func testService(t testing.TB, app harness.App, name string, ports []corev1.ServicePort, edits ...func(*corev1.ServiceSpec)) manifest.Object {
	t.Helper()
	return mustParse(t, app.Service(name, ports, edits...))
}

// namedPort is harness.ServicePort(port, target) named name.
func namedPort(name string, port int32, target string) corev1.ServicePort {
	p := harness.ServicePort(port, target)
	p.Name = name
	return p
}

// storeObjects writes objs through n's object store, as an apply does.
func storeObjects(t *testing.T, n *testNode, objs ...manifest.Object) {
	t.Helper()
	if _, err := n.agent.api.objects.store(objs); err != nil {
		t.Fatal(err)
	}
}

// waitSubnetSettled waits until n's pod subnet claim has settled.
func waitSubnetSettled(t *testing.T, n *testNode, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, func() error {
		if !n.agent.own.subnets.settled.Load() {
			return fmt.Errorf("%s has not settled its subnet", n.name)
		}
		return nil
	})
}

// serveTLS serves h over TLS with tr's server config and certificate
// (httptest would put its own in an empty list), until the test ends.
func serveTLS(t *testing.T, tr *trust.Trust, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = tr.ServerTLS()
	srv.TLS.Certificates = []tls.Certificate{*tr.TLSCert()}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}
