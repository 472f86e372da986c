package sealed

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

type keyring [][]byte

func (k *keyring) Keys() [][]byte { return *k }

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

// secret is a Secret as manifest.Encode writes it.
const secret = `{"kind":"Secret","apiVersion":"v1","metadata":{"name":"db","namespace":"default","uid":"u1","creationTimestamp":"2026-12-06T00:00:00Z"},"data":{"password":"czNjcjN0LXZhbHVl","user":"YWRtaW4="},"type":"Opaque"}`

func TestSealedDataOpensOnlyForItsRecordWithAHeldKey(t *testing.T) {
	ring := &keyring{key(1)}
	box := New(ring)
	v, err := box.Seal("secret/default/db", []byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	for _, clear := range []string{"czNjcjN0LXZhbHVl", "s3cr3t-value", `"data"`} {
		if strings.Contains(string(v), clear) {
			t.Fatalf("sealed record holds %s:\n%s", clear, v)
		}
	}
	if !strings.Contains(string(v), `"name":"db"`) || !strings.Contains(string(v), `"type":"Opaque"`) {
		t.Fatalf("the Secret's metadata is not in clear:\n%s", v)
	}
	if len(v) > len(secret)+2*Overhead+32 {
		t.Fatalf("sealed record of %d bytes for a Secret of %d", len(v), len(secret))
	}
	if got, err := box.Open("secret/default/db", v); err != nil || string(got) != secret {
		t.Fatalf("open:\n%s\n%v\nwant\n%s", got, err, secret)
	}
	// Two seals of one value differ (a fresh nonce each).
	if v2, _ := box.Seal("secret/default/db", []byte(secret)); bytes.Equal(v, v2) {
		t.Fatal("two seals are equal")
	}
	// Moved under another name, or altered: refused.
	if _, err := box.Open("secret/default/other", v); err == nil {
		t.Fatal("opened under another record key")
	}
	i := bytes.Index(v, []byte(`"sealedData":"`)) + len(`"sealedData":"`) + 60
	bad := bytes.Clone(v)
	bad[i] ^= 'A' ^ 'B'
	if bad[i] == v[i] {
		bad[i] = 'C'
	}
	if _, err := box.Open("secret/default/db", bad); err == nil {
		t.Fatal("opened an altered value")
	}
	// Altered into what is not base64 (what the flip above gives for a
	// few characters, as C to @): refused, not passed on as if in clear.
	bad[i] = '@'
	if _, err := box.Open("secret/default/db", bad); err == nil {
		t.Fatal("opened a value altered into what is not base64")
	}
	// A rotation: the new key in use first, the old one still held.
	*ring = keyring{key(2), key(1)}
	if got, err := box.Open("secret/default/db", v); err != nil || string(got) != secret {
		t.Fatalf("open with the old key still held: %v", err)
	}
	// The old key removed: the value sealed under it no longer opens.
	*ring = keyring{key(2)}
	if _, err := box.Open("secret/default/db", v); !errors.Is(err, ErrNoKey) {
		t.Fatalf("want ErrNoKey, got %v", err)
	}
	// No key (--insecure): values are kept as they are.
	*ring = nil
	if got, _ := box.Seal("secret/default/db", []byte(secret)); string(got) != secret {
		t.Fatal("sealed with no key")
	}
	if got, _ := box.Open("secret/default/db", []byte(secret)); string(got) != secret {
		t.Fatal("a value not sealed is not returned as it is")
	}
}

func FuzzOpen(f *testing.F) {
	box := New(&keyring{key(1)})
	v, _ := box.Seal("secret/a/b", []byte(secret))
	f.Add(v)
	f.Add([]byte(`{"sealedData":"AHNlYWxlZDE="}`))
	f.Add([]byte("{}"))
	f.Add(bytes.Repeat([]byte{1}, 64))
	f.Fuzz(func(t *testing.T, value []byte) {
		box.Open("secret/a/b", value) // never panics
		if p, err := box.open("secret/a/b", value); err == nil && len(p) > len(value) {
			t.Fatalf("opened %d bytes to %d", len(value), len(p))
		}
	})
}
