package crdt

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	tests := []Record{
		live("svc/default/web", ts(1732931234123456789, 3), "node-1", `{"image":"nginx","replicas":2}`),
		tomb("svc/default/web", ts(1, 0), "n"),
		live("a/b/c", ts(math.MinInt64, math.MaxUint32), strings.Repeat("o", MaxOriginLen), `null`),
		live(strings.Repeat("k", MaxKeyLen-4)+"/n/x", ts(math.MaxInt64, 0), "ü", `"`+strings.Repeat("v", MaxValueLen-2)+`"`),
		{Key: "a/b/c", Origin: "n"}, // live record with no value
		live("Dienst/Namensraum/Größe", ts(0, 0), "knoten-ä", `[]`),
	}
	for _, r := range tests {
		b, err := EncodeRecord(r)
		if err != nil {
			t.Fatalf("EncodeRecord(%.60q): %v", r.Key, err)
		}
		if len(b) > MaxEncodedLen {
			t.Errorf("EncodeRecord(%.60q): %d bytes, over MaxEncodedLen %d", r.Key, len(b), MaxEncodedLen)
		}
		got, err := DecodeRecord(b)
		if err != nil {
			t.Fatalf("DecodeRecord(EncodeRecord(%.60q)): %v", r.Key, err)
		}
		if !got.Equal(r) {
			t.Errorf("round trip of %.60q changed the record: got %+v", r.Key, got)
		}
	}
}

func TestEncodeIsCompact(t *testing.T) {
	r := live("svc/default/web", ts(1732931234123456789, 0), "node-1", `{"replicas":2}`)
	b, err := EncodeRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	// header + 1 logical + 1+15 key + 1+6 origin + 1+14 value
	if want := 10 + 1 + 16 + 7 + 15; len(b) != want {
		t.Errorf("encoded %d bytes, want %d", len(b), want)
	}
}

func TestDecodeDoesNotAliasInput(t *testing.T) {
	b, err := EncodeRecord(live("a/b/c", ts(1, 0), "n", `{"x":1}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0
	}
	if string(r.Value) != `{"x":1}` {
		t.Errorf("Value changed with the input buffer: %q", r.Value)
	}
}

func TestEncodeRejectsInvalidRecords(t *testing.T) {
	good := live("svc/default/web", ts(1, 0), "n", `1`)
	mod := func(f func(*Record)) Record { r := good; f(&r); return r }
	tests := map[string]Record{
		"empty key":              mod(func(r *Record) { r.Key = "" }),
		"one slash":              mod(func(r *Record) { r.Key = "svc/web" }),
		"three slashes":          mod(func(r *Record) { r.Key = "svc/default/web/x" }),
		"empty kind":             mod(func(r *Record) { r.Key = "/default/web" }),
		"empty namespace":        mod(func(r *Record) { r.Key = "svc//web" }),
		"empty name":             mod(func(r *Record) { r.Key = "svc/default/" }),
		"key too long":           mod(func(r *Record) { r.Key = "svc/default/" + strings.Repeat("w", MaxKeyLen) }),
		"key not utf-8":          mod(func(r *Record) { r.Key = "svc/default/\xff" }),
		"key with newline":       mod(func(r *Record) { r.Key = "svc/default/we\nb" }),
		"key with NUL":           mod(func(r *Record) { r.Key = "svc/de\x00fault/web" }),
		"empty origin":           mod(func(r *Record) { r.Origin = "" }),
		"origin too long":        mod(func(r *Record) { r.Origin = strings.Repeat("o", MaxOriginLen+1) }),
		"origin not utf-8":       mod(func(r *Record) { r.Origin = "\xc3" }),
		"tombstone with a value": mod(func(r *Record) { r.Deleted = true }),
		"value not JSON":         mod(func(r *Record) { r.Value = json.RawMessage(`{oops`) }),
		"value too long":         mod(func(r *Record) { r.Value = json.RawMessage(`"` + strings.Repeat("v", MaxValueLen) + `"`) }),
	}
	for name, r := range tests {
		if _, err := EncodeRecord(r); !errors.Is(err, ErrInvalidRecord) {
			t.Errorf("%s: EncodeRecord error = %v, want ErrInvalidRecord", name, err)
		}
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	good, err := EncodeRecord(live("svc/default/web", ts(1, 2), "n", `1`))
	if err != nil {
		t.Fatal(err)
	}
	with := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	tests := map[string][]byte{
		"nil":             nil,
		"short header":    good[:5],
		"header only":     good[:headerLen],
		"unknown format":  with(func(b []byte) []byte { b[0] = 2; return b }),
		"unknown flag":    with(func(b []byte) []byte { b[1] = 2; return b }),
		"trailing byte":   append(append([]byte(nil), good...), 0),
		"truncated value": good[:len(good)-1],
		"non-minimal varint": with(func(b []byte) []byte {
			// Logical 2 written as 0x82 0x00 instead of 0x02.
			return append(append(append([]byte(nil), b[:headerLen]...), 0x82, 0x00), b[headerLen+1:]...)
		}),
		"logical over uint32": append(binary.AppendUvarint(append([]byte(nil), good[:headerLen]...), math.MaxUint32+1), good[headerLen+1:]...),
		"varint overflow":     append(append([]byte(nil), good[:headerLen]...), bytes.Repeat([]byte{0xff}, 11)...),
		"key length huge": append(binary.AppendUvarint(append([]byte(nil), good[:headerLen+1]...), math.MaxUint64),
			good[headerLen+2:]...),
		"key length past end": append(binary.AppendUvarint(append([]byte(nil), good[:headerLen+1]...), MaxKeyLen),
			good[headerLen+2:]...),
		"oversized input": make([]byte, MaxEncodedLen+1),
	}
	for name, b := range tests {
		if r, err := DecodeRecord(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeRecord = %+v, %v; want ErrMalformed", name, r, err)
		}
	}
}

func TestDecodeRejectsInvalidRecord(t *testing.T) {
	// A well-formed encoding of a record that breaks Validate, as a buggy or
	// hostile peer could send.
	b := []byte{formatV1, flagDeleted, 0, 0, 0, 0, 0, 0, 0, 1, 0}
	b = appendBytes(b, "svc/web")
	b = appendBytes(b, "n")
	b = appendBytes(b, "")
	if _, err := DecodeRecord(b); !errors.Is(err, ErrInvalidRecord) {
		t.Errorf("DecodeRecord(bad key) error = %v, want ErrInvalidRecord", err)
	}
}

func TestEncodeDecodeProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := genRecord("svc/default/web", "a/b/c").Draw(t, "r")
		r.Version = ts(rapid.Int64().Draw(t, "wall"), rapid.Uint32().Draw(t, "logical"))
		b, err := EncodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeRecord(b)
		if err != nil || !got.Equal(r) {
			t.Fatalf("DecodeRecord(EncodeRecord(%+v)) = %+v, %v", r, got, err)
		}
	})
}

// FuzzDecodeRecord feeds arbitrary bytes to DecodeRecord. It must never panic,
// and whatever it accepts must be a valid record whose canonical encoding is
// exactly the input.
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range []Record{
		live("svc/default/web", ts(1732931234123456789, 3), "node-1", `{"image":"nginx"}`),
		tomb("deploy/edge/cam", ts(5, 0), "n2"),
		{Key: "a/b/c", Origin: "n"},
		live("a/b/c", ts(-1, math.MaxUint32), "ö", `[1,2,{"x":null}]`),
	} {
		b, err := EncodeRecord(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	_, key, _ := ed25519.GenerateKey(nil)
	signed, err := Sign(live("svc/default/web", ts(7, 1), "node-1", `{"a":1}`), key)
	if err != nil {
		f.Fatal(err)
	}
	if b, err := EncodeRecord(signed); err == nil {
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{})
	f.Add([]byte{formatV1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRecord(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrInvalidRecord) {
				t.Fatalf("error %v wraps neither ErrMalformed nor ErrInvalidRecord", err)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted record fails Validate: %v", err)
		}
		again, err := EncodeRecord(r)
		if err != nil {
			t.Fatalf("re-encode accepted record: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("encoding not canonical:\n in %x\nout %x", b, again)
		}
	})
}

// TestSignedRecordsRoundTripAndVerify: a signed record survives encoding
// (format 2), verifies, and stops verifying when any field it says
// changes or another key claims it; an unsigned one is format 1 and does
// not verify.
func TestSignedRecordsRoundTripAndVerify(t *testing.T) {
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	r := live("node/cluster/n2", ts(10, 2), "n2", `{"podSubnet":"10.22.2.0/24"}`)
	s, err := Sign(r, key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := EncodeRecord(s)
	if err != nil || b[0] != formatV2 {
		t.Fatalf("encode: %v, format %d", err, b[0])
	}
	got, err := DecodeRecord(b)
	if err != nil || !VerifySignature(got) || !got.Equal(s) {
		t.Fatalf("decoded %+v, %v; verifies %v", got, err, VerifySignature(got))
	}
	_, other, _ := ed25519.GenerateKey(nil)
	for name, tamper := range map[string]func(*Record){
		"value":   func(x *Record) { x.Value = []byte(`{"podSubnet":"8.8.8.0/24"}`) },
		"origin":  func(x *Record) { x.Origin = "n3" },
		"version": func(x *Record) { x.Version.Wall++ },
		"key":     func(x *Record) { x.Key = "node/cluster/n3" },
		"deleted": func(x *Record) { x.Deleted, x.Value = true, nil },
		"signer":  func(x *Record) { x.Signer = []byte(other.Public().(ed25519.PublicKey)) },
	} {
		x := got
		tamper(&x)
		if VerifySignature(x) {
			t.Errorf("changing the %s kept the signature valid", name)
		}
	}
	if u, _ := EncodeRecord(r); u[0] != formatV1 || VerifySignature(r) {
		t.Fatalf("an unsigned record: format %d, verifies %v", u[0], VerifySignature(r))
	}
	if _, err := DecodeRecord(b[:len(b)-1]); err == nil {
		t.Fatal("a truncated signature decoded")
	}
}

// BenchmarkVerifySignature measures checking one signed record of a
// 1 KiB value (Ed25519 verify over SigningBytes).
func BenchmarkVerifySignature(b *testing.B) {
	_, key, _ := ed25519.GenerateKey(nil)
	r, err := Sign(live("node/cluster/n2", ts(10, 2), "n2", `"`+strings.Repeat("x", 1022)+`"`), key)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if !VerifySignature(r) {
			b.Fatal("does not verify")
		}
	}
}
