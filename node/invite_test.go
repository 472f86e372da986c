package node

import (
	"crypto/ed25519"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
)

// testCA makes a cluster CA in a temp dir (initCluster, the CA key kept
// with the first node's credentials).
func testCA(t testing.TB) *credentials {
	t.Helper()
	dir := t.TempDir()
	creds, err := initCluster(dir, dir, "n1", keyOf("n1"), nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

func testInvitation(t testing.TB, creds *credentials, name string, ttl time.Duration, now time.Time) invitation {
	t.Helper()
	inv, err := newInvitation(creds.CA, creds.CAKey, name, ttl, now)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func TestInvitationsParseAsPrinted(t *testing.T) {
	creds := testCA(t)
	inv := testInvitation(t, creds, "n2", time.Hour, time.Now())
	got, err := parseInvitation(inv.String() + "\n")
	if err != nil || got.Pin != inv.Pin || !got.Cert.Equal(inv.Cert) || !got.Key.Equal(inv.Key) || got.Name() != "n2" {
		t.Fatalf("parse(%q) = %+v, %v", inv, got, err)
	}
	if by, ok := joinDeadline(got.Cert); !ok || by.Sub(time.Now()) > time.Hour || by.Sub(time.Now()) < 59*time.Minute {
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
		if _, err := parseInvitation(bad.tok); err == nil || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("parse(%.40q...) = %v, want an error with %q", bad.tok, err, bad.msg)
		}
	}
	if _, err := newInvitation(creds.CA, creds.CAKey, "N2\n", time.Hour, time.Now()); err == nil || !strings.Contains(err.Error(), "--name") {
		t.Errorf("an invitation for a bad name: %v", err)
	}
	if _, err := newInvitation(creds.CA, creds.CAKey, "n2", 10*time.Second, time.Now()); err == nil || !strings.Contains(err.Error(), "--ttl") {
		t.Errorf("an invitation with a 10s ttl: %v", err)
	}
}

// joinRequest is what joinWithToken sends for inv at unix, as signed by
// the invitation's key.
func joinRequest(inv invitation, unix int64) api.JoinRequest {
	return SignJoinRequest(inv.Name(), inv.Key, inv.Cert.Raw, time.Unix(unix, 0))
}

// TestAdmitChecksInvitationKeyAndName: a join needs a certificate the
// cluster CA issued for the name and key, carrying a join deadline that
// has not passed, and the key's signature over the request at about the
// member's time; a version 1 token, another CA's or another name's
// certificate, a joined node's certificate, a revoked key, an invitation
// made before the name was forgotten and a name bound to another key are
// refused with the fix; the same node asking again after the deadline is
// admitted.
func TestAdmitChecksInvitationKeyAndName(t *testing.T) {
	now := time.Now()
	creds := testCA(t)
	good := testInvitation(t, creds, "n3", time.Hour, now)
	n2 := testInvitation(t, creds, "n2", time.Hour, now.Add(-2*time.Hour)) // joined, deadline passed
	late := testInvitation(t, creds, "n4", time.Minute, now.Add(-time.Hour))
	revoked := testInvitation(t, creds, "n5", time.Hour, now)
	forgotten := testInvitation(t, creds, "n6", time.Hour, now.Add(-time.Hour))
	otherCA := testCA(t)
	foreign := testInvitation(t, otherCA, "n3", time.Hour, now)
	joinedCert, err := issueNodeCert(creds.CA, creds.CAKey, "n7", keyOf("n7").Public().(ed25519.PublicKey), nil, now, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	look := admitLookups{
		ca:      creds.CA,
		bound:   func(name string) ([]byte, bool) { return n2.Key.Public().(ed25519.PublicKey), name == "n2" },
		revoked: func(k []byte) bool { return revoked.Key.Public().(ed25519.PublicKey).Equal(ed25519.PublicKey(k)) },
		forgotten: func(name string) (time.Time, bool) {
			return now.Add(-time.Minute), name == "n6"
		},
	}
	unix := now.Unix()
	with := func(inv invitation, f func(*api.JoinRequest)) api.JoinRequest {
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
		{"the same node again, past its deadline", joinRequest(n2, unix), 0, ""},
		{"bad name", with(good, func(r *api.JoinRequest) { r.Name = "N3\n" }), http.StatusBadRequest, "--name"},
		{"bad key", with(good, func(r *api.JoinRequest) { r.Key = r.Key[:5] }), http.StatusBadRequest, "node key"},
		{"version 1 token", api.JoinRequest{Name: "n3", Key: good.Key.Public().(ed25519.PublicKey), TokenID: "abcdef", Secret: "0123456789abcdef"}, http.StatusForbidden, "starling join-token NODE-NAME"},
		{"another CA's certificate", joinRequest(foreign, unix), http.StatusForbidden, "starling join-token n3"},
		{"another name's certificate", with(good, func(r *api.JoinRequest) { r.Name = "n9" }), http.StatusForbidden, `not "n9"`},
		{"another key's certificate", with(good, func(r *api.JoinRequest) { r.Key = keyOf("x").Public().(ed25519.PublicKey) }), http.StatusForbidden, "not the record's signer"},
		{"not signed by the key", with(good, func(r *api.JoinRequest) { r.Sig = ed25519.Sign(keyOf("x"), joinSigningBytes("n3", r.Cert, unix)) }), http.StatusForbidden, "not signed by the invitation's key"},
		{"signature over another time", with(good, func(r *api.JoinRequest) { r.Time++ }), http.StatusForbidden, "not signed by the invitation's key"},
		{"stale request", joinRequest(good, unix-600), http.StatusForbidden, "check the clocks"},
		{"deadline passed", joinRequest(late, unix), http.StatusForbidden, "time to join ended"},
		{"a joined node's certificate", with(good, func(r *api.JoinRequest) {
			k := keyOf("n7")
			r.Name, r.Key, r.Cert = "n7", k.Public().(ed25519.PublicKey), joinedCert.Raw
			r.Sig = ed25519.Sign(k, joinSigningBytes("n7", r.Cert, unix))
		}), http.StatusForbidden, "no join deadline"},
		{"revoked key", joinRequest(revoked, unix), http.StatusForbidden, "revoked"},
		{"made before a forget", joinRequest(forgotten, unix), http.StatusForbidden, "made before 'starling node forget n6'"},
		{"name in use", with(testInvitation(t, creds, "n2", time.Hour, now), keep), http.StatusConflict, "starling node forget n2"},
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

// TestMoveCAKeyOffANode: 'starling ca move-off' copies the CA into the CA
// dir and removes the key from the data dir; invitations are then made
// from the CA dir and not from the data dir; a CA dir of another cluster
// is refused and the data dir keeps its key.
func TestMoveCAKeyOffANode(t *testing.T) {
	dir, caDir, otherDir := t.TempDir(), t.TempDir(), t.TempDir()
	creds, err := initCluster(dir, dir, "n1", keyOf("n1"), nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := initCluster(t.TempDir(), otherDir, "x", keyOf("x"), nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := MoveCAKey(dir, otherDir); err == nil || !strings.Contains(err.Error(), "another cluster's CA") || !HoldsCAKey(dir) {
		t.Fatalf("move to another cluster's CA dir: %v (data dir still holds its key: %v)", err, HoldsCAKey(dir))
	}
	if err := MoveCAKey(dir, caDir); err != nil {
		t.Fatal(err)
	}
	if HoldsCAKey(dir) || !HoldsCAKey(caDir) {
		t.Fatalf("after move-off: data dir holds a CA key %v, CA dir %v", HoldsCAKey(dir), HoldsCAKey(caDir))
	}
	if _, _, err := MakeInvitation(dir, "n2", time.Hour); err == nil {
		t.Fatal("an invitation made from a data dir without the CA key")
	}
	tok, _, err := MakeInvitation(caDir, "n2", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := parseInvitation(tok)
	if err != nil || inv.Pin != caPin(creds.CA) || verifyNodeCert(inv.Cert, creds.CA, "n2", inv.Key.Public().(ed25519.PublicKey), time.Now()) != nil {
		t.Fatalf("invitation from the CA dir: %v", err)
	}
}
