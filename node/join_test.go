package node

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/store"
)

func TestJoinTokensParseAsPrinted(t *testing.T) {
	tok, err := newJoinToken(strings.Repeat("ab", 32))
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseJoinToken(tok.String() + "\n")
	if err != nil || got != tok {
		t.Fatalf("parse(%q) = %+v, %v", tok, got, err)
	}
	for _, bad := range []string{"", "SLTKN-1-abc-abcdef.0123456789abcdef", tok.String()[:len(tok.String())-1], strings.Replace(tok.String(), "SLTKN-1", "SWMTKN-1", 1),
		tok.String() + "\n-A INPUT -j ACCEPT"} {
		if _, err := parseJoinToken(bad); err == nil || !strings.Contains(err.Error(), "starling join-token") {
			t.Errorf("parse(%q) = %v, want an error naming 'starling join-token'", bad, err)
		}
	}
}

// TestAdmitChecksTokenKeyAndName: a join needs a live token whose secret
// matches; a revoked key or a name bound to another key is refused with
// the fix; the same node joining again (same name, same key) is admitted.
func TestAdmitChecksTokenKeyAndName(t *testing.T) {
	now := time.Now()
	tokens := map[string]joinTokenRecord{
		"abcdef": {SecretHash: secretHash("0123456789abcdef"), Expires: now.Add(time.Hour)},
		"old000": {SecretHash: secretHash("0123456789abcdef"), Expires: now.Add(-time.Second)},
	}
	n2 := keyOf("n2").Public().(ed25519.PublicKey)
	other := keyOf("other").Public().(ed25519.PublicKey)
	look := admitLookups{
		token:   func(id string) (joinTokenRecord, bool) { t, ok := tokens[id]; return t, ok },
		bound:   func(name string) ([]byte, bool) { return n2, name == "n2" },
		revoked: func(k []byte) bool { return string(k) == string(keyOf("revoked").Public().(ed25519.PublicKey)) },
	}
	good := api.JoinRequest{Name: "n3", Key: other, TokenID: "abcdef", Secret: "0123456789abcdef"}
	with := func(f func(*api.JoinRequest)) api.JoinRequest { r := good; f(&r); return r }
	cases := []struct {
		name   string
		req    api.JoinRequest
		status int
		msg    string
	}{
		{"valid", good, 0, ""},
		{"the same node again", with(func(r *api.JoinRequest) { r.Name, r.Key = "n2", n2 }), 0, ""},
		{"bad name", with(func(r *api.JoinRequest) { r.Name = "N3\n" }), http.StatusBadRequest, "--name"},
		{"bad key", with(func(r *api.JoinRequest) { r.Key = r.Key[:5] }), http.StatusBadRequest, "node key"},
		{"unknown token", with(func(r *api.JoinRequest) { r.TokenID = "zzzzzz" }), http.StatusForbidden, "starling join-token"},
		{"malformed token ID", with(func(r *api.JoinRequest) { r.TokenID = "../../x" }), http.StatusForbidden, "starling join-token"},
		{"wrong secret", with(func(r *api.JoinRequest) { r.Secret = "0123456789abcdee" }), http.StatusForbidden, "starling join-token"},
		{"expired token", with(func(r *api.JoinRequest) { r.TokenID = "old000" }), http.StatusForbidden, "expired"},
		{"revoked key", with(func(r *api.JoinRequest) { r.Key = keyOf("revoked").Public().(ed25519.PublicKey) }), http.StatusForbidden, "remove node.key"},
		{"name in use", with(func(r *api.JoinRequest) { r.Name = "n2" }), http.StatusConflict, "starling node forget n2"},
	}
	for _, tc := range cases {
		rf := admit(tc.req, look, now)
		switch {
		case tc.status == 0 && rf != nil:
			t.Errorf("%s: refused: %v", tc.name, rf)
		case tc.status != 0 && (rf == nil || rf.status != tc.status || !strings.Contains(rf.msg, tc.msg)):
			t.Errorf("%s: got %+v, want %d with %q", tc.name, rf, tc.status, tc.msg)
		}
	}
}

// joinServer runs the peer port of a cluster's first node (credentials
// made by initCluster in a temp dir) with a token of its own; it returns
// the node, its token and the server.
func joinServer(t *testing.T) (*Agent, joinToken, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	key := keyOf("n1")
	creds, err := initCluster(dir, "n1", key, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	a := &Agent{cfg: Config{Name: "n1"}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), store: st, clock: hlc.New(nil),
		id: &identity{name: "n1", key: key, store: st}}
	a.trust = newTrust(creds, key, a.id)
	gc := gossip.DefaultConfig()
	gc.Name, gc.BindAddr, gc.BindPort, gc.SecretKey = "n1", "127.0.0.1", 0, creds.GossipKeys[0]
	gc.Logger = a.log
	if a.cluster, err = gossip.New(gc, gossip.NewMemState()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.cluster.Shutdown() })
	a.join = &admission{store: st, id: a.id, trust: a.trust, clock: a.clock, self: "n1", keys: a.cluster.Keys, log: a.log}
	tok, err := newJoinToken(caPin(creds.CA))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(joinTokenRecord{SecretHash: secretHash(tok.Secret), Expires: time.Now().Add(time.Hour)})
	if _, err := st.Apply(crdt.Record{Key: joinTokenKey(tok.ID), Value: b, Version: a.clock.Now(), Origin: "n1"}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(a.peerHandler())
	srv.TLS = a.trust.serverTLS()
	// httptest would put its own certificate in an empty list.
	srv.TLS.Certificates = []tls.Certificate{*a.trust.tlsCert()}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return a, tok, srv
}

func writeToken(t *testing.T, tok string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "join.token")
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestJoinWithTokenOverPinnedTLS: a node with a token is admitted and
// saves the CA, the gossip key and its certificate (mode 0600), from
// which it starts again with no token; a token whose pin is another CA's
// never sends its secret to the node (TLS fails, and joining stops); a wrong secret is
// refused at once, with no retry.
func TestJoinWithTokenOverPinnedTLS(t *testing.T) {
	a, tok, srv := joinServer(t)
	seed := strings.TrimPrefix(srv.URL, "https://")
	host, port, _ := splitHostPort(seed, 0)
	// joinWithToken dials the gossip port + 1.
	gossipAddr := net.JoinHostPort(host, strconv.Itoa(port-1))
	dir := t.TempDir()
	key := keyOf("n2")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	creds, err := joinWithToken(ctx, dir, writeToken(t, tok.String()), "n2", key, []string{gossipAddr}, 7946, log)
	if err != nil {
		t.Fatal(err)
	}
	if !creds.CA.Equal(a.trust.creds.CA) || len(creds.GossipKeys) != 1 || string(creds.GossipKeys[0]) != string(a.trust.creds.GossipKeys[0]) {
		t.Fatal("the joined node holds another CA or gossip key")
	}
	if err := verifyNodeCert(creds.NodeCert, a.trust.creds.CA, "n2", key.Public().(ed25519.PublicKey), time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{caCertFile, caKeyFile, nodeCertFile, gossipKeyFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v", f, err, fi.Mode())
		}
	}
	cfg := DefaultConfig()
	cfg.Name, cfg.DataDir, cfg.Join = "n2", dir, []string{"192.0.2.1"}
	if _, err := setupCredentials(ctx, cfg, key, log); err != nil {
		t.Fatalf("restart with saved credentials and no token: %v", err)
	}

	otherCA, _, _ := newCA(time.Now())
	wrongPin := tok
	wrongPin.Pin = caPin(otherCA)
	start := time.Now()
	_, err = joinWithToken(ctx, t.TempDir(), writeToken(t, wrongPin.String()), "n3", keyOf("n3"), []string{gossipAddr}, 7946, log)
	if err == nil || !strings.Contains(err.Error(), "does not chain to the pinned cluster CA") || time.Since(start) > 5*time.Second {
		t.Fatalf("a token pinning another CA: %v after %s", err, time.Since(start))
	}
	wrongSecret := tok
	wrongSecret.Secret = strings.Repeat("z", 16)
	start = time.Now()
	_, err = joinWithToken(ctx, t.TempDir(), writeToken(t, wrongSecret.String()), "n3", keyOf("n3"), []string{gossipAddr}, 7946, log)
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "starling join-token") || time.Since(start) > 5*time.Second {
		t.Fatalf("wrong secret: %v after %s", err, time.Since(start))
	}
}

// TestSetupCredentials: with no --join the first agent creates the
// cluster; --join without a token is refused with the command that makes
// one; a data dir whose certificate names another node is refused with
// the --name to use; --insecure on a secure node's data dir is refused;
// a certificate about to expire is renewed at start.
func TestSetupCredentials(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	key := keyOf("n1")
	cfg := DefaultConfig()
	cfg.Name, cfg.DataDir, cfg.Advertise = "n1", dir, "192.0.2.7"
	creds, err := setupCredentials(ctx, cfg, key, log)
	if err != nil || creds == nil {
		t.Fatalf("first agent: %v", err)
	}
	if len(creds.NodeCert.IPAddresses) != 1 || creds.NodeCert.IPAddresses[0].String() != "192.0.2.7" {
		t.Fatalf("certificate IPs %v, want the advertised address", creds.NodeCert.IPAddresses)
	}
	other := cfg
	other.Name = "n9"
	if _, err := setupCredentials(ctx, other, key, log); err == nil || !strings.Contains(err.Error(), "start with --name n1") {
		t.Fatalf("another name: %v", err)
	}
	insecure := cfg
	insecure.Insecure = true
	if _, err := setupCredentials(ctx, insecure, key, log); err == nil || !strings.Contains(err.Error(), "start without --insecure") {
		t.Fatalf("--insecure on a secure data dir: %v", err)
	}
	joiner := DefaultConfig()
	joiner.Name, joiner.DataDir, joiner.Join = "n2", t.TempDir(), []string{"192.0.2.1"}
	if _, err := setupCredentials(ctx, joiner, keyOf("n2"), log); err == nil || !strings.Contains(err.Error(), "starling join-token") || !strings.Contains(err.Error(), "--join-token-file") {
		t.Fatalf("--join without a token: %v", err)
	}
	// A certificate with 10 days left is renewed at start.
	old, err := issueNodeCert(creds.CA, creds.CAKey, "n1", key.Public().(ed25519.PublicKey), nil, time.Now().Add(-80*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := writePEM(filepath.Join(dir, nodeCertFile), "CERTIFICATE", old.Raw); err != nil {
		t.Fatal(err)
	}
	renewed, err := setupCredentials(ctx, cfg, key, log)
	if err != nil || !renewed.NodeCert.NotAfter.After(time.Now().Add(80*24*time.Hour)) {
		t.Fatalf("renewal: %v, notAfter %v", err, renewed.NodeCert.NotAfter)
	}
}

// BenchmarkAcceptCertifiedStatusRecord is BenchmarkAcceptStatusRecord in
// a secure cluster: the record carries its node's certificate, verified
// once and then found in the cache (the steady state: a node's status is
// rewritten, its certificate is not).
func BenchmarkAcceptCertifiedStatusRecord(b *testing.B) {
	creds, err := initCluster(b.TempDir(), "a", keyOf("a"), nil, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	cert, err := issueNodeCert(creds.CA, creds.CAKey, "b", keyOf("b").Public().(ed25519.PublicKey), nil, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	s := goodStatus()
	for i := 1; i < 10; i++ {
		r := s.Replicas[0]
		r.Name, r.Ordinal, r.PodIP = fmt.Sprintf("web-%d", i), i, fmt.Sprintf("10.22.2.%d", 5+i)
		s.Replicas = append(s.Replicas, r)
	}
	s.Cert = cert.Raw
	rec := signAs(b, "b", statusRecord(b, s, "b"))
	x := newRejects(testClusterCIDR, creds, func(string) ([]byte, bool) { return rec.Signer, true }, noRevocations, noOwner, newTextLogger(io.Discard), newMetrics().rejectedRecords)
	b.ReportMetric(float64(len(rec.Value)), "value-bytes")
	for b.Loop() {
		if err := x.check(rec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyNodeCert is the first sight of a node's certificate
// (parse and chain verification, no cache).
func BenchmarkVerifyNodeCert(b *testing.B) {
	creds, err := initCluster(b.TempDir(), "a", keyOf("a"), nil, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	pub := keyOf("b").Public().(ed25519.PublicKey)
	cert, err := issueNodeCert(creds.CA, creds.CAKey, "b", pub, nil, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := newCertCache(creds.CA).verify(cert.Raw, "b", pub, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// peerTrust is the trust of a node of the cluster of creds, named name,
// with keyOf(keyName) and a certificate for them, and its own store, in
// which each of known is bound to keyOf(its name), as a certified status
// record makes it.
func peerTrust(t *testing.T, creds *credentials, name, keyName string, known ...string) *trust {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, k := range known {
		s := goodStatus()
		s.Name = k
		if _, err := st.Apply(signAs(t, k, statusRecord(t, s, k))); err != nil {
			t.Fatal(err)
		}
	}
	key := keyOf(keyName)
	cert, err := issueNodeCert(creds.CA, creds.CAKey, name, key.Public().(ed25519.PublicKey), nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c := *creds
	c.NodeCert = cert
	return newTrust(&c, key, &identity{name: name, key: key, store: st})
}
