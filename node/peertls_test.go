package node

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
)

// TestStatusNeedsACertificateFromTheCA: in a secure cluster a node's
// status record is accepted only with a certificate the cluster CA issued
// for that node and the record's signer.
func TestStatusNeedsACertificateFromTheCA(t *testing.T) {
	creds := testCAOf(t, "a")
	foreignCA, foreignKey, _ := trust.NewCA(time.Now())
	cert := func(ca *trust.Credentials, name, keyName string) []byte {
		c, err := trust.SignNodeCert(ca.CA, ca.CAKey, name, keyOf(keyName).Public().(ed25519.PublicKey), nil, time.Now(), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Raw
	}
	foreign := &trust.Credentials{CA: foreignCA, CAKey: foreignKey}
	m := newMetrics()
	x := newRejects(testClusterCIDR, creds, fakeIDs{}, nil, 0, nil, newTextLogger(io.Discard), m.rejectedRecords)
	cases := []struct {
		name string
		cert []byte
		ok   bool
	}{
		{"issued for b and its key", cert(creds, "b", "b"), true},
		{"no certificate", nil, false},
		{"garbage", []byte("not a certificate"), false},
		{"for another name", cert(creds, "c", "b"), false},
		{"for another key", cert(creds, "b", "c"), false},
		{"from another CA", cert(foreign, "b", "b"), false},
	}
	for _, tc := range cases {
		s := goodStatus()
		s.Cert = tc.cert
		err := x.check(signAs(t, "b", statusRecord(t, s, "b")))
		if tc.ok != (err == nil) {
			t.Errorf("%s: err = %v", tc.name, err)
		}
		if err != nil && !strings.Contains(err.Error(), "cert:") {
			t.Errorf("%s: err = %v, want reason cert", tc.name, err)
		}
	}
}

// TestForgetVoidsEarlierCertificatesInGossip: after 'node forget b', a
// status record that would bind the free name b with a certificate made
// before the forget (an old invitation's, written straight to gossip by
// a holder of the gossip key) is refused (reason revoked); one made after
// it binds the name.
func TestForgetVoidsEarlierCertificatesInGossip(t *testing.T) {
	creds := testCAOf(t, "a")
	now := time.Now()
	forgotten := func(name string) (time.Time, bool) { return now.Add(-time.Hour), name == "b" }
	x := newRejects(testClusterCIDR, creds, fakeIDs{forgotten: forgotten}, nil, 0, nil, newTextLogger(io.Discard), newMetrics().rejectedRecords)
	for _, tc := range []struct {
		name   string
		issued time.Time
		ok     bool
	}{
		{"made two hours before the forget", now.Add(-3 * time.Hour), false},
		{"made after the forget", now, true},
	} {
		c, err := trust.SignNodeCert(creds.CA, creds.CAKey, "b", keyOf("b").Public().(ed25519.PublicKey), nil, tc.issued, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		s := goodStatus()
		s.Cert = c.Raw
		err = x.check(signAs(t, "b", statusRecord(t, s, "b")))
		if tc.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "revoked:")) {
			t.Errorf("%s: err = %v", tc.name, err)
		}
	}
}

// TestPeerTLSChecksTheBoundKey: over the peer port, nodes accept each
// other only with a certificate from the cluster CA whose key is the one
// the name is bound to. Every node holds the CA key, so a certificate
// minted for a known name with another key (an impostor) is refused as a
// client and as a server; a request with no certificate gets 401.
func TestPeerTLSChecksTheBoundKey(t *testing.T) {
	creds := testCA(t)
	serve := func(a *trust.Trust) string {
		return serveTLS(t, a, a.RequirePeer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "hello "+r.Header.Get(trust.ProxiedHeader))
		}))).URL
	}
	call := func(from *trust.Trust, to, url string) (int, string, error) {
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: from.ClientTLS(to)}}
		resp, err := client.Get(url)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	n1 := peerTrust(t, creds, "n1", "n1", "n1", "n2")
	n2 := peerTrust(t, creds, "n2", "n2", "n1", "n2")
	impostorClient := peerTrust(t, creds, "n2", "evil", "n1", "n2")
	impostorServer := peerTrust(t, creds, "n1", "evil", "n1", "n2")
	url := serve(n1)
	if code, body, err := call(n2, "n1", url); err != nil || code != 200 || body != "hello n2" {
		t.Fatalf("n2 -> n1: %d %q %v", code, body, err)
	}
	if code, body, err := call(impostorClient, "n1", url); err != nil || code != http.StatusForbidden || !strings.Contains(body, "is not node") {
		t.Fatalf("impostor client -> n1: %d %q %v", code, body, err)
	}
	if _, _, err := call(n2, "n1", serve(impostorServer)); err == nil || !strings.Contains(err.Error(), "is not node") {
		t.Fatalf("n2 -> impostor server: %v", err)
	}
	plain := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := plain.Get(url)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no certificate: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestPinnedTLSWithServerPinAcceptsOnlyThatNode: the CLI's client config
// pins the CA and the node's key. Every node holds the CA key, so another
// certificate from the same CA (a node posing as the API server) passes
// the CA pin but not the server pin; the real node passes both, also
// after renewing its certificate (same key).
func TestPinnedTLSWithServerPinAcceptsOnlyThatNode(t *testing.T) {
	creds := testCA(t)
	serve := func(tr *trust.Trust) string {
		return serveTLS(t, tr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })).URL
	}
	real := peerTrust(t, creds, "n1", "n1")
	impostor := peerTrust(t, creds, "n1", "evil")
	get := func(url, serverPin string) error {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: client.PinnedTLS(trust.CaPin(creds.CA), serverPin)}}
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	pin := trust.SpkiPin(real.Cert.Load())
	if err := get(serve(real), pin); err != nil {
		t.Fatalf("the pinned node: %v", err)
	}
	if err := get(serve(impostor), pin); err == nil || !strings.Contains(err.Error(), "not the node the client config was written for") {
		t.Fatalf("another node's certificate from the same CA: %v", err)
	}
	if err := get(serve(impostor), ""); err != nil {
		t.Fatalf("with the CA pin alone (joining), any node will do: %v", err)
	}
	renewed, err := trust.SignNodeCert(creds.CA, creds.CAKey, "n1", keyOf("n1").Public().(ed25519.PublicKey), nil, time.Now(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	real.Cert.Store(renewed)
	if err := get(serve(real), pin); err != nil {
		t.Fatalf("the pinned node after renewal: %v", err)
	}
}

// TestDamagedCredentialsAreNotANewCluster: a data dir that lost ca.crt
// but still holds other credentials is refused with the fix, not taken
// for an empty one (which would make a new CA).
func TestDamagedCredentialsAreNotANewCluster(t *testing.T) {
	dir := t.TempDir()
	if _, err := trust.CreateCluster(dir, dir, "n1", keyOf("n1"), nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, trust.CaCertFile)); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Name, cfg.DataDir = "n1", dir
	_, _, err := setupCredentials(context.Background(), cfg, keyOf("n1"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "damaged") || errors.Is(err, os.ErrNotExist) {
		t.Fatalf("setup with ca.crt gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, trust.CaCertFile)); err == nil {
		t.Fatal("a new CA was made")
	}
}

// TestKeyInstallWaitsForTheRevocation: the rotation 'node forget' starts
// names the revoked key in its install step; a node that does not hold
// that revocation yet answers 409 (and installs nothing), so it cannot
// hand the new key to the forgotten node through GET /v1/keys; once the
// revocation reaches it, the same request installs the key.
func TestKeyInstallWaitsForTheRevocation(t *testing.T) {
	a, _ := joinServer(t)
	a.guard.keys = &trust.Keyring{Cluster: a.mem.cluster, Trust: a.guard.trust, DataDir: t.TempDir(), Self: "n1", Log: a.log}
	srv := serveTLS(t, a.guard.trust, a.peerHandler())
	// n2 is a node n1 knows (a certified status record binds its key).
	s := goodStatus()
	s.Name = "n2"
	if _, err := a.store.Apply(signAs(t, "n2", statusRecord(t, s, "n2"))); err != nil {
		t.Fatal(err)
	}
	n2 := peerTrust(t, a.guard.trust.Creds, "n2", "n2", "n1", "n2")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: n2.ClientTLS("n1")}}
	forgotten := keyOf("n3").Public().(ed25519.PublicKey)
	newKey := bytes.Repeat([]byte{7}, 32)
	install := func() (int, string) {
		body, _ := json.Marshal(api.KeyOp{Op: "install", Key: newKey, Revoked: [][]byte{forgotten}})
		resp, err := client.Post(srv.URL+"/v1/keys", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := install(); code != http.StatusConflict || !strings.Contains(body, trust.ErrRevocationPending.Error()) {
		t.Fatalf("install before the revocation arrived: %d %s", code, body)
	}
	if len(a.mem.cluster.Keys()) != 1 {
		t.Fatalf("the key was installed before the revocation arrived: %d keys", len(a.mem.cluster.Keys()))
	}
	rv, _ := json.Marshal(trust.Revocation{Name: "n3", Key: forgotten})
	if _, err := a.store.Apply(signAs(t, "n2", crdt.Record{Key: trust.RevokedKey(forgotten), Value: rv, Version: a.clock.Now(), Origin: "n2"})); err != nil {
		t.Fatal(err)
	}
	if code, body := install(); code != http.StatusOK {
		t.Fatalf("install once the revocation arrived: %d %s", code, body)
	}
	if keys := a.mem.cluster.Keys(); len(keys) != 2 || !bytes.Equal(keys[1], newKey) && !bytes.Equal(keys[0], newKey) {
		t.Fatalf("keyring after the install: %d keys", len(keys))
	}
}
