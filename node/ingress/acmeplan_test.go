package ingress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"
)

func certPEM(t *testing.T, hosts []string, notAfter time.Time, life ...time.Duration) map[string][]byte {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lifetime := 90 * 24 * time.Hour
	if len(life) > 0 {
		lifetime = life[0]
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: hosts, NotBefore: notAfter.Add(-lifetime), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), "tls.key": []byte("k")}
}

// TestACertificateIsDueWhenMissingWrongOrEnding: one owner per
// certificate, the same on every node whatever order it lists the
// nodes in; due when none is stored, when it misses a host, when it
// ends within RenewBefore; not otherwise, nor for Ingresses that do not
// ask.
func TestACertificateIsDueWhenMissingWrongOrEnding(t *testing.T) {
	now := time.Unix(2e9, 0)
	stored := map[string]map[string][]byte{
		"a/good":   certPEM(t, []string{"good.test"}, now.Add(60*24*time.Hour)),
		"a/ending": certPEM(t, []string{"ending.test"}, now.Add(10*24*time.Hour)),
		"a/narrow": certPEM(t, []string{"one.test"}, now.Add(60*24*time.Hour)),
		// A CA of 24 h certificates: renewed with 8 h left, and one
		// issued minutes ago is never due at once (no loop of orders).
		"a/day":   certPEM(t, []string{"day.test"}, now.Add(7*time.Hour), 24*time.Hour),
		"a/fresh": certPEM(t, []string{"fresh.test"}, now.Add(50*time.Minute), time.Hour),
	}
	get := func(ns, name string) (map[string][]byte, bool) { d, ok := stored[ns+"/"+name]; return d, ok }
	tlsOf := func(secret string, hosts ...string) []TLS { return []TLS{{Secret: secret, Hosts: hosts}} }
	ings := []Ingress{
		{Namespace: "a", Name: "1", ACME: true, TLS: tlsOf("good", "good.test")},
		{Namespace: "a", Name: "2", ACME: true, TLS: tlsOf("ending", "ending.test")},
		{Namespace: "a", Name: "3", ACME: true, TLS: tlsOf("narrow", "one.test")},
		{Namespace: "a", Name: "4", ACME: true, TLS: tlsOf("narrow", "two.test")}, // the same Secret: both hosts
		// A wildcard rule host (refused at apply) never joins the order:
		// HTTP-01 cannot prove it, and it would fail new.test's too.
		{Namespace: "a", Name: "5", ACME: true, TLS: tlsOf("new"), Rules: []Rule{{Host: "new.test"}, {Host: "*.new.test"}}},
		{Namespace: "a", Name: "6", TLS: tlsOf("manual", "manual.test")},
		{Namespace: "a", Name: "7", ACME: true, TLS: tlsOf("day", "day.test")},
		{Namespace: "a", Name: "8", ACME: true, TLS: tlsOf("fresh", "fresh.test")},
	}
	got := CertsDue(ings, get, []string{"n1", "n2", "n3"}, now)
	again := CertsDue(ings, get, []string{"n3", "n1", "n2"}, now)
	var keys []string
	for i, w := range got {
		keys = append(keys, w.Key())
		if w.Owner == "" || w.Owner != again[i].Owner {
			t.Errorf("%s: owner %q, then %q with the nodes in another order", w.Key(), w.Owner, again[i].Owner)
		}
		want := map[string]string{"a/good": "", "a/ending": "the certificate ends in 240h0m0s", "a/narrow": "the stored certificate does not cover two.test",
			"a/new": "no certificate stored", "a/day": "the certificate ends in 7h0m0s", "a/fresh": ""}[w.Key()]
		if w.Why != want {
			t.Errorf("%s: due %q, want %q", w.Key(), w.Why, want)
		}
	}
	if !slices.Equal(keys, []string{"a/day", "a/ending", "a/fresh", "a/good", "a/narrow", "a/new"}) {
		t.Errorf("certificates %v", keys)
	}
	if w := got[4]; strings.Join(w.Hosts, ",") != "one.test,two.test" {
		t.Errorf("a/narrow hosts %v", w.Hosts)
	}
	if w := got[5]; strings.Join(w.Hosts, ",") != "new.test" {
		t.Errorf("a/new hosts %v, want new.test alone", w.Hosts)
	}
	owners := map[string]bool{}
	for i := range 40 {
		ws := CertsDue([]Ingress{{Namespace: "n", Name: "x", ACME: true, TLS: tlsOf(string(rune('a'+i%26))+"x", "h.test")}}, get, []string{"n1", "n2", "n3"}, now)
		owners[ws[0].Owner] = true
	}
	if len(owners) != 3 {
		t.Errorf("40 certificates are owned by %d of 3 nodes", len(owners))
	}
}
