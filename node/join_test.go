package node

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/store"
)

// joinServer runs the peer port of a cluster's first node (credentials
// made by trust.CreateCluster in a temp dir, which holds the CA key); it returns
// the node and the server.
func joinServer(t *testing.T) (*Agent, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	key := keyOf("n1")
	creds, err := trust.CreateCluster(dir, dir, "n1", key, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	a := &Agent{cfg: Config{Name: "n1"}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), store: track(st), clock: hlc.New(nil),
		guard: guard{id: &trust.Identity{Name: "n1", Key: key, Store: st}}}
	a.guard.trust = trust.NewTrust(creds, key, a.guard.id)
	gc := gossip.DefaultConfig()
	gc.Name, gc.BindAddr, gc.BindPort, gc.SecretKey = "n1", "127.0.0.1", 0, creds.GossipKeys[0]
	gc.Logger = a.log
	if a.mem.cluster, err = gossip.New(gc, gossip.NewMemState()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.mem.cluster.Shutdown() })
	a.guard.join = &trust.Admission{Store: st, Id: a.guard.id, Trust: a.guard.trust, Clock: a.clock, Self: "n1", Cluster: a.mem.cluster, Log: a.log}
	return a, serveTLS(t, a.guard.trust, a.peerHandler())
}

func writeToken(t *testing.T, tok string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "join.token")
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestJoinWithInvitationOverPinnedTLS: a node with an invitation is
// admitted and saves its key (the invitation's, replacing one it made),
// the CA certificate, the gossip key and its certificate (mode 0600), and
// no CA key, from which it starts again with no invitation; an
// invitation whose pin is another CA's never reaches the node (TLS
// fails, and joining stops); an invitation for another --name and one
// past its deadline are refused before any request; another CA's
// certificate is refused at once, with no retry.
func TestJoinWithInvitationOverPinnedTLS(t *testing.T) {
	a, srv := joinServer(t)
	seed := strings.TrimPrefix(srv.URL, "https://")
	host, port, _ := trust.SplitHostPort(seed, 0)
	// trust.JoinWithToken dials the gossip port + 1.
	gossipAddr := net.JoinHostPort(host, strconv.Itoa(port-1))
	dir := t.TempDir()
	made, err := trust.LoadOrCreateNodeKey(dir) // as the agent does before it joins
	if err != nil {
		t.Fatal(err)
	}
	inv := testInvitation(t, a.guard.trust.Creds, "n2", time.Hour, time.Now())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	creds, key, err := trust.JoinWithToken(ctx, dir, writeToken(t, inv.String()), "n2", []string{gossipAddr}, 7946, log)
	if err != nil {
		t.Fatal(err)
	}
	if !key.Equal(inv.Key) || key.Equal(made) {
		t.Fatal("the joined node's key is not the invitation's")
	}
	if saved, err := trust.LoadOrCreateNodeKey(dir); err != nil || !saved.Equal(inv.Key) {
		t.Fatalf("node.key after the join is not the invitation's key (%v)", err)
	}
	if !creds.CA.Equal(a.guard.trust.Creds.CA) || len(creds.GossipKeys) != 1 || string(creds.GossipKeys[0]) != string(a.guard.trust.Creds.GossipKeys[0]) || creds.CAKey != nil {
		t.Fatal("the joined node holds another CA or gossip key, or a CA key")
	}
	for _, f := range []string{trust.CaCertFile, trust.NodeCertFile, trust.GossipKeyFile, trust.NodeKeyFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v", f, err, fi.Mode())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, trust.CaKeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the joined node has a CA key file: %v", err)
	}
	cfg := DefaultConfig()
	cfg.Name, cfg.DataDir, cfg.Join = "n2", dir, []string{"192.0.2.1"}
	if _, _, err := setupCredentials(ctx, cfg, key, log); err != nil {
		t.Fatalf("restart with saved credentials and no invitation: %v", err)
	}

	otherCA := testCA(t)
	wrongPin := testInvitation(t, a.guard.trust.Creds, "n3", time.Hour, time.Now())
	wrongPin.Pin = trust.CaPin(otherCA.CA)
	start := time.Now()
	_, _, err = trust.JoinWithToken(ctx, t.TempDir(), writeToken(t, wrongPin.String()), "n3", []string{gossipAddr}, 7946, log)
	if err == nil || !strings.Contains(err.Error(), "does not chain to the pinned cluster CA") || time.Since(start) > 5*time.Second {
		t.Fatalf("an invitation pinning another CA: %v after %s", err, time.Since(start))
	}
	foreign := testInvitation(t, otherCA, "n3", time.Hour, time.Now())
	foreign.Pin = trust.CaPin(a.guard.trust.Creds.CA)
	start = time.Now()
	_, _, err = trust.JoinWithToken(ctx, t.TempDir(), writeToken(t, foreign.String()), "n3", []string{gossipAddr}, 7946, log)
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "starling join-token n3") || time.Since(start) > 5*time.Second {
		t.Fatalf("another CA's certificate: %v after %s", err, time.Since(start))
	}
	if _, _, err = trust.JoinWithToken(ctx, t.TempDir(), writeToken(t, inv.String()), "n9", []string{gossipAddr}, 7946, log); err == nil || !strings.Contains(err.Error(), "start with --name n2") {
		t.Fatalf("an invitation for another name: %v", err)
	}
	late := testInvitation(t, a.guard.trust.Creds, "n4", time.Minute, time.Now().Add(-time.Hour))
	if _, _, err = trust.JoinWithToken(ctx, t.TempDir(), writeToken(t, late.String()), "n4", []string{gossipAddr}, 7946, log); err == nil || !strings.Contains(err.Error(), "time to join ended") {
		t.Fatalf("an invitation past its deadline: %v", err)
	}
}

// TestSetupCredentials: with no --join the first agent creates the
// cluster (keeping the CA key, with a WARN); --join without an invitation
// is refused with the command that makes one; a data dir whose
// certificate names another node is refused with the --name to use;
// --insecure on a secure node's data dir is refused; a node that holds
// the CA key renews a certificate of the 90-day kind at start, and one
// that does not keeps its certificate.
func TestSetupCredentials(t *testing.T) {
	ctx := context.Background()
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	dir := t.TempDir()
	key := keyOf("n1")
	cfg := DefaultConfig()
	cfg.Name, cfg.DataDir, cfg.Advertise = "n1", dir, "192.0.2.7"
	creds, _, err := setupCredentials(ctx, cfg, key, log)
	if err != nil || creds == nil {
		t.Fatalf("first agent: %v", err)
	}
	if len(creds.NodeCert.IPAddresses) != 1 || creds.NodeCert.IPAddresses[0].String() != "192.0.2.7" {
		t.Fatalf("certificate IPs %v, want the advertised address", creds.NodeCert.IPAddresses)
	}
	if !strings.Contains(logs.String(), "holds the cluster's CA key") {
		t.Fatalf("no WARN about the CA key on the node:\n%s", logs.String())
	}
	other := cfg
	other.Name = "n9"
	if _, _, err := setupCredentials(ctx, other, key, log); err == nil || !strings.Contains(err.Error(), "start with --name n1") {
		t.Fatalf("another name: %v", err)
	}
	insecure := cfg
	insecure.Insecure = true
	if _, _, err := setupCredentials(ctx, insecure, key, log); err == nil || !strings.Contains(err.Error(), "start without --insecure") {
		t.Fatalf("--insecure on a secure data dir: %v", err)
	}
	joiner := DefaultConfig()
	joiner.Name, joiner.DataDir, joiner.Join = "n2", t.TempDir(), []string{"192.0.2.1"}
	if _, _, err := setupCredentials(ctx, joiner, keyOf("n2"), log); err == nil || !strings.Contains(err.Error(), "starling join-token n2") || !strings.Contains(err.Error(), "--join-token-file") {
		t.Fatalf("--join without an invitation: %v", err)
	}
	// A certificate of the 90-day kind with 10 days left is renewed at
	// start, to the CA's lifetime.
	shortCA := *creds.CA
	shortCA.NotAfter = time.Now().Add(10 * 24 * time.Hour)
	// It names the advertised address: only its end is due.
	old, err := trust.SignNodeCert(&shortCA, creds.CAKey, "n1", key.Public().(ed25519.PublicKey), []netip.Addr{netip.MustParseAddr("192.0.2.7")}, time.Now().Add(-80*24*time.Hour), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := trust.WritePEM(filepath.Join(dir, trust.NodeCertFile), "CERTIFICATE", old.Raw); err != nil {
		t.Fatal(err)
	}
	renewed, _, err := setupCredentials(ctx, cfg, key, log)
	if err != nil || !renewed.NodeCert.NotAfter.Equal(creds.CA.NotAfter) {
		t.Fatalf("renewal: %v, notAfter %v, want the CA's %v", err, renewed.NodeCert.NotAfter, creds.CA.NotAfter)
	}
	// Moved off, the CA key renews nothing and is not warned about; the
	// short certificate is.
	if err := trust.WritePEM(filepath.Join(dir, trust.NodeCertFile), "CERTIFICATE", old.Raw); err != nil {
		t.Fatal(err)
	}
	if err := trust.MoveCAKey(dir, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	kept, _, err := setupCredentials(ctx, cfg, key, log)
	if err != nil || !kept.NodeCert.Equal(old) || kept.CAKey != nil || strings.Contains(logs.String(), "holds the cluster's CA key") ||
		!strings.Contains(logs.String(), "holds no CA key to renew it") {
		t.Fatalf("without the CA key: %v, cert renewed %v, logs:\n%s", err, !kept.NodeCert.Equal(old), logs.String())
	}
}

// BenchmarkAcceptCertifiedStatusRecord is BenchmarkAcceptStatusRecord in
// a secure cluster: the record carries its node's certificate, verified
// once and then found in the cache (the steady state: a node's status is
// rewritten, its certificate is not).
func BenchmarkAcceptCertifiedStatusRecord(b *testing.B) {
	creds := testCA(b)
	cert, err := trust.SignNodeCert(creds.CA, creds.CAKey, "b", keyOf("b").Public().(ed25519.PublicKey), nil, time.Now(), time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	benchmarkAccept(b, creds, cert.Raw)
}

// BenchmarkVerifyNodeCert is the first sight of a node's certificate
// (parse and chain verification, no cache).
func BenchmarkVerifyNodeCert(b *testing.B) {
	creds := testCA(b)
	pub := keyOf("b").Public().(ed25519.PublicKey)
	cert, err := trust.SignNodeCert(creds.CA, creds.CAKey, "b", pub, nil, time.Now(), time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := trust.NewCertCache(creds.CA).Verify(cert.Raw, "b", pub, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// peerTrust is the trust of a node of the cluster of creds, named name,
// with keyOf(keyName) and a certificate for them, and its own store, in
// which each of known is bound to keyOf(its name), as a certified status
// record makes it.
func peerTrust(t *testing.T, creds *trust.Credentials, name, keyName string, known ...string) *trust.Trust {
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
	cert, err := trust.SignNodeCert(creds.CA, creds.CAKey, name, key.Public().(ed25519.PublicKey), nil, time.Now(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	c := *creds
	c.NodeCert = cert
	return trust.NewTrust(&c, key, &trust.Identity{Name: name, Key: key, Store: st})
}
