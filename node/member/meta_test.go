package member

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
	"testing"
)

// encodeMemberMetaV1 is the metadata of an agent that predates version
// 2: member-since only.
func encodeMemberMetaV1(since int64) []byte {
	return binary.BigEndian.AppendUint64([]byte{MetaV1}, uint64(since))
}

func TestMemberMetaVersions(t *testing.T) {
	m := Meta{Since: 1_700_000_000_000_000_000, Started: 1_800_000_000_000_000_000}
	if got, ok := DecodeMeta(EncodeMeta(m)); !ok || got != m {
		t.Fatalf("version 2 round trip: %+v %v, want %+v", got, ok, m)
	}
	if got, ok := DecodeMeta(encodeMemberMetaV1(m.Since)); !ok || got != (Meta{Since: m.Since}) {
		t.Fatalf("version 1: %+v %v, want since only", got, ok)
	}
	// A later version keeps version 2's bytes first.
	if got, ok := DecodeMeta(append(append([]byte{3}, EncodeMeta(m)[1:]...), 0xaa, 0xbb)); !ok || got != m {
		t.Fatalf("version 3 with more bytes: %+v %v, want %+v", got, ok, m)
	}
	for name, b := range map[string][]byte{
		"empty":               nil,
		"since beyond int64":  {MetaV1, 0xff, 0, 0, 0, 0, 0, 0, 0},
		"v1 too long":         append(encodeMemberMetaV1(1), 0),
		"v2 too short":        EncodeMeta(m)[:16],
		"v2 run zero":         EncodeMeta(Meta{Since: 1}),
		"v2 run beyond int64": append(encodeMemberMetaV1(1)[1:], 0xff, 0, 0, 0, 0, 0, 0, 0),
		"version 0":           append([]byte{0}, EncodeMeta(m)[1:]...),
	} {
		if name == "v2 run beyond int64" {
			b = append([]byte{MetaV2}, b...)
		}
		if got, ok := DecodeMeta(b); ok {
			t.Errorf("%s: decoded as %+v", name, got)
		}
	}
}

// A peer's metadata is untrusted bytes: any input decodes without a
// panic, and what decodes encodes back to the same bytes.
func FuzzDecodeMemberMeta(f *testing.F) {
	f.Add(EncodeMeta(Meta{Since: 1, Started: 2}))
	f.Add(encodeMemberMetaV1(1))
	f.Add([]byte{MetaV2})
	f.Add(SignMeta(Meta{Since: 1, Started: 2}, "n1", netip.MustParseAddrPort("192.168.250.21:7946"), keyOf("n1")))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, ok := DecodeMeta(b)
		if !ok {
			return
		}
		if m.Since < 0 || m.Started < 0 {
			t.Fatalf("%x decoded to a negative time: %+v", b, m)
		}
		want, got := encodeMemberMetaV1(m.Since), b
		if m.Started != 0 {
			want, got = EncodeMeta(m)[1:], b[1:17] // the version byte and later bytes aside
		}
		if !bytes.Equal(want, got) {
			t.Fatalf("%x decoded to %+v, which encodes as %x", b, m, want)
		}
	})
}

// A peer's metadata and address are untrusted: any bytes verify without
// a panic, and nothing but the signer's own verifies.
func FuzzVerifyMemberMeta(f *testing.F) {
	addr := netip.MustParseAddrPort("192.168.250.21:7946")
	f.Add(SignMeta(Meta{Since: 1, Started: 2}, "n1", addr, keyOf("n1")), "n1", uint16(7946))
	f.Add(EncodeMeta(Meta{Since: 1, Started: 2}), "n1", uint16(7946))
	f.Fuzz(func(t *testing.T, b []byte, name string, port uint16) {
		m, err := VerifyMeta(name, netip.AddrPortFrom(addr.Addr(), port), b, keyOf("n1").Public().(ed25519.PublicKey))
		if err == nil && (m.Started <= 0 || m.Since < 0) {
			t.Fatalf("%x verified with %+v", b, m)
		}
		if _, err := VerifyMeta(name, netip.AddrPortFrom(addr.Addr(), port), b, keyOf("evil").Public().(ed25519.PublicKey)); err == nil {
			t.Fatalf("%x verified with a key that never signed", b)
		}
	})
}

// keyOf is a fixed node key for tests, from the name.
func keyOf(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("test key " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}
