package node

import (
	"crypto/ed25519"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/starling-orchestrator/starling/node/api"
)

// testCA makes a cluster CA in a temp dir (trust.CreateCluster, the CA key kept
// with the first node's credentials).
func testCA(t testing.TB) *trust.Credentials {
	t.Helper()
	return testCAOf(t, "n1")
}

// testCAOf is testCA with first as the first node (with keyOf(first)).
func testCAOf(t testing.TB, first string) *trust.Credentials {
	t.Helper()
	dir := t.TempDir()
	creds, err := trust.CreateCluster(dir, dir, first, keyOf(first), nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

func testInvitation(t testing.TB, creds *trust.Credentials, name string, ttl time.Duration, now time.Time) trust.Invitation {
	t.Helper()
	inv, err := trust.NewInvitation(creds.CA, creds.CAKey, name, ttl, now)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func TestInvitationsParseAsPrinted(t *testing.T) {
	creds := testCA(t)
	inv := testInvitation(t, creds, "n2", time.Hour, time.Now())
	got, err := trust.ReadInvitation(inv.String() + "\n")
	if err != nil || got.Pin != inv.Pin || !got.Cert.Equal(inv.Cert) || !got.Key.Equal(inv.Key) || got.Name() != "n2" {
		t.Fatalf("parse(%q) = %+v, %v", inv, got, err)
	}
	if by, ok := trust.JoinDeadline(got.Cert); !ok || by.Sub(time.Now()) > time.Hour || by.Sub(time.Now()) < 59*time.Minute {
		t.Fatalf("join deadline %v %v, want in an hour", by, ok)
	}
	other := testInvitation(t, creds, "n3", time.Hour, time.Now())
	s := inv.String()
	swapped := s[:strings.LastIndex(s, ".")] + other.String()[strings.LastIndex(other.String(), "."):]
	for _, bad := range []struct{ tok, msg string }{
		{"", "starling join-token NODE-NAME"},
		{"SLTKN-1-" + strings.Repeat("ab", 32) + "-abcdef.0123456789abcdef", "starling join-token NODE-NAME"},
		{s[:len(s)-1], "starling join-token NODE-NAME"},
		{strings.Replace(s, "SLTKN-2", "SWMTKN-1", 1), "starling join-token NODE-NAME"},
		{s + "\n-A INPUT -j ACCEPT", "starling join-token NODE-NAME"},
		{swapped, "not for the key it carries"},
	} {
		if _, err := trust.ReadInvitation(bad.tok); err == nil || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("parse(%.40q...) = %v, want an error with %q", bad.tok, err, bad.msg)
		}
	}
	if _, err := trust.NewInvitation(creds.CA, creds.CAKey, "N2\n", time.Hour, time.Now()); err == nil || !strings.Contains(err.Error(), "--name") {
		t.Errorf("an invitation for a bad name: %v", err)
	}
	if _, err := trust.NewInvitation(creds.CA, creds.CAKey, "n2", 10*time.Second, time.Now()); err == nil || !strings.Contains(err.Error(), "--ttl") {
		t.Errorf("an invitation with a 10s ttl: %v", err)
	}
}

// testServer is the pin of the member admit runs on in these tests.
const testServer = "1234abcd"

// joinRequest is what trust.JoinWithToken sends for inv at unix to the member
// testServer, as signed by the invitation's key.
func joinRequest(inv trust.Invitation, unix int64) api.JoinRequest {
	return trust.SignJoinRequest(inv.Name(), inv.Key, inv.Cert.Raw, testServer, time.Unix(unix, 0))
}

// TestAdmitChecksInvitationKeyAndName: a join needs a certificate the
// cluster CA issued for the name and key, carrying a join deadline that
// has not passed, and the key's signature over the request for this
// member at about its time; a version 1 token, another CA's or another
// name's certificate, a joined node's certificate, a request meant for
// another member (relayed), a revoked key, an invitation made before the
// name was forgotten, an invitation past its deadline (a used one too:
// it is the node's key) and a name bound to another key are refused with
// the fix; an invitation made after a forget (clocks a few seconds
// apart) is admitted.
func TestAdmitChecksInvitationKeyAndName(t *testing.T) {
	now := time.Now()
	creds := testCA(t)
	good := testInvitation(t, creds, "n3", time.Hour, now)
	n2 := testInvitation(t, creds, "n2", time.Hour, now.Add(-2*time.Hour)) // joined, deadline passed
	reinvited := testInvitation(t, creds, "n8", time.Hour, now.Add(-30*time.Second))
	late := testInvitation(t, creds, "n4", time.Minute, now.Add(-time.Hour))
	revoked := testInvitation(t, creds, "n5", time.Hour, now)
	forgotten := testInvitation(t, creds, "n6", 2*time.Hour, now.Add(-time.Hour))
	otherCA := testCA(t)
	foreign := testInvitation(t, otherCA, "n3", time.Hour, now)
	joinedCert, err := trust.SignNodeCert(creds.CA, creds.CAKey, "n7", keyOf("n7").Public().(ed25519.PublicKey), nil, now, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	look := trust.AdmitLookups{
		Ca:      creds.CA,
		Self:    testServer,
		Bound:   func(name string) ([]byte, bool) { return n2.Key.Public().(ed25519.PublicKey), name == "n2" },
		Revoked: func(k []byte) bool { return revoked.Key.Public().(ed25519.PublicKey).Equal(ed25519.PublicKey(k)) },
		Forgotten: func(name string) (time.Time, bool) {
			// n8 was forgotten "after" its new invitation by a node whose
			// clock runs 3 s ahead of the CA machine's.
			return map[string]time.Time{"n6": now.Add(-time.Minute), "n8": now.Add(-27 * time.Second)}[name], name == "n6" || name == "n8"
		},
	}
	unix := now.Unix()
	with := func(inv trust.Invitation, f func(*api.JoinRequest)) api.JoinRequest {
		r := joinRequest(inv, unix)
		f(&r)
		return r
	}
	keep := func(*api.JoinRequest) {}
	cases := []struct {
		name   string
		req    api.JoinRequest
		status int
		msg    string
	}{
		{"valid", joinRequest(good, unix), 0, ""},
		{"made after a forget, clocks 3 s apart", joinRequest(reinvited, unix), 0, ""},
		{"a used invitation, past its deadline", joinRequest(n2, unix), http.StatusForbidden, "time to join ended"},
		{"meant for another member", trust.SignJoinRequest("n3", good.Key, good.Cert.Raw, "feedbeef", now), http.StatusForbidden, "meant for another member"},
		{"from the future", joinRequest(good, unix+600), http.StatusForbidden, "check the clocks"},
		{"bad name", with(good, func(r *api.JoinRequest) { r.Name = "N3\n" }), http.StatusBadRequest, "--name"},
		{"bad key", with(good, func(r *api.JoinRequest) { r.Key = r.Key[:5] }), http.StatusBadRequest, "node key"},
		{"version 1 token", api.JoinRequest{Name: "n3", Key: good.Key.Public().(ed25519.PublicKey), TokenID: "abcdef", Secret: "0123456789abcdef"}, http.StatusForbidden, "starling join-token NODE-NAME"},
		{"another CA's certificate", joinRequest(foreign, unix), http.StatusForbidden, "starling join-token n3"},
		{"another name's certificate", with(good, func(r *api.JoinRequest) { r.Name = "n9" }), http.StatusForbidden, `not "n9"`},
		{"another key's certificate", with(good, func(r *api.JoinRequest) { r.Key = keyOf("x").Public().(ed25519.PublicKey) }), http.StatusForbidden, "not the record's signer"},
		{"not signed by the key", with(good, func(r *api.JoinRequest) {
			r.Sig = ed25519.Sign(keyOf("x"), trust.JoinSigningBytes("n3", r.Cert, testServer, unix))
		}), http.StatusForbidden, "not signed by the invitation's key"},
		{"signature over another time", with(good, func(r *api.JoinRequest) { r.Time++ }), http.StatusForbidden, "not signed by the invitation's key"},
		{"stale request", joinRequest(good, unix-600), http.StatusForbidden, "check the clocks"},
		{"deadline passed", joinRequest(late, unix), http.StatusForbidden, "time to join ended"},
		{"a joined node's certificate", with(good, func(r *api.JoinRequest) {
			k := keyOf("n7")
			r.Name, r.Key, r.Cert = "n7", k.Public().(ed25519.PublicKey), joinedCert.Raw
			r.Sig = ed25519.Sign(k, trust.JoinSigningBytes("n7", r.Cert, testServer, unix))
		}), http.StatusForbidden, "no join deadline"},
		{"revoked key", joinRequest(revoked, unix), http.StatusForbidden, "revoked"},
		{"made before a forget", joinRequest(forgotten, unix), http.StatusForbidden, "made before 'starling node forget n6'"},
		{"name in use", with(testInvitation(t, creds, "n2", time.Hour, now), keep), http.StatusConflict, "starling node forget n2"},
	}
	for _, tc := range cases {
		rf := trust.Admit(tc.req, look, now)
		switch {
		case tc.status == 0 && rf != nil:
			t.Errorf("%s: refused: %v", tc.name, rf)
		case tc.status != 0 && (rf == nil || rf.Status != tc.status || !strings.Contains(rf.Msg, tc.msg)):
			t.Errorf("%s: got %+v, want %d with %q", tc.name, rf, tc.status, tc.msg)
		}
	}
}

// TestMoveCAKeyOffANode: 'starling ca move-off' copies the CA into the CA
// dir and removes the key from the data dir; invitations are then made
// from the CA dir and not from the data dir; a CA dir of another cluster
// (its certificate alone too) and the data dir under another name are
// refused, and the data dir keeps its key.
func TestMoveCAKeyOffANode(t *testing.T) {
	dir, caDir, otherDir := t.TempDir(), t.TempDir(), t.TempDir()
	creds, err := trust.CreateCluster(dir, dir, "n1", keyOf("n1"), nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := trust.CreateCluster(t.TempDir(), otherDir, "x", keyOf("x"), nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := trust.MoveCAKey(dir, otherDir); err == nil || !strings.Contains(err.Error(), "another cluster's CA") || !trust.HoldsCAKey(dir) {
		t.Fatalf("move to another cluster's CA dir: %v (data dir still holds its key: %v)", err, trust.HoldsCAKey(dir))
	}
	if err := trust.MoveCAKey(dir, dir+"/."); err == nil || !strings.Contains(err.Error(), "the data dir itself") || !trust.HoldsCAKey(dir) {
		t.Fatalf("move to the data dir under another name: %v (data dir still holds its key: %v)", err, trust.HoldsCAKey(dir))
	}
	certOnly := t.TempDir()
	if err := os.WriteFile(filepath.Join(certOnly, trust.CaCertFile), mustRead(t, filepath.Join(otherDir, trust.CaCertFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := trust.MoveCAKey(dir, certOnly); err == nil || !strings.Contains(err.Error(), "another cluster's CA") || !trust.HoldsCAKey(dir) {
		t.Fatalf("move to a dir with another cluster's CA certificate only: %v", err)
	}
	if err := trust.MoveCAKey(dir, caDir); err != nil {
		t.Fatal(err)
	}
	if trust.HoldsCAKey(dir) || !trust.HoldsCAKey(caDir) {
		t.Fatalf("after move-off: data dir holds a CA key %v, CA dir %v", trust.HoldsCAKey(dir), trust.HoldsCAKey(caDir))
	}
	if _, _, err := trust.MakeInvitation(dir, "n2", time.Hour); err == nil {
		t.Fatal("an invitation made from a data dir without the CA key")
	}
	tok, _, err := trust.MakeInvitation(caDir, "n2", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := trust.ReadInvitation(tok)
	if err != nil || inv.Pin != trust.CaPin(creds.CA) || trust.VerifyNodeCert(inv.Cert, creds.CA, "n2", inv.Key.Public().(ed25519.PublicKey), time.Now()) != nil {
		t.Fatalf("invitation from the CA dir: %v", err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
