package member

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/netip"
)

// Member metadata (gossiped by memberlist with every alive message), a
// peer's untrusted bytes: anything that is not one of these decodes as
// none.
//   - version 1 (9 bytes): 1, member-since (Unix ns, big endian);
//   - version 2 (17 bytes): 2, member-since, then when this run of the
//     agent started (Unix ns, big endian); a later version (a greater
//     version byte) keeps those 17 bytes first and is read as version 2.
//   - version 3 (81 bytes): 3, member-since, run start, then the node's
//     Ed25519 signature (64 bytes, RFC 8032) over memberSigDomain, the
//     node's name, the address and port its alive messages give, and
//     the 16 bytes of member-since and run start (SignedBytes).
//     The signature binds the address to the key the name is bound to
//     (the signer of its certified status record): peers take an alive
//     message for the name only with it (node's memberAuth.check), and route to a
//     subnet only via an address its owner signed (routes.desired).
//
// An agent that reads only version 1 takes a version 2 node for one
// without metadata (the youngest, for arbiters) until it is upgraded;
// one that reads version 2 reads version 3's first 17 bytes.
const (
	MetaV1 = 1
	MetaV2 = 2
	MetaV3 = 3
	// MetaV3Len is the length of version 3 metadata.
	MetaV3Len = 17 + ed25519.SignatureSize
)

// memberSigDomain separates member signatures from every other use of
// a node key (records are signed over crdt's own encoding).
const memberSigDomain = "starling member v3\x00"

// Meta is what a node's metadata says of it.
type Meta struct {
	// Since is when the node first started with its data (Unix ns):
	// its age as a member (arbiters).
	Since int64
	// Started is when the node's current agent run started (Unix ns),
	// 0 when its metadata does not say (version 1). Peers learn it with
	// the alive message that makes the node a member again, before any
	// record it writes in that run (view.StaleRecords).
	Started int64
}

func EncodeMeta(m Meta) []byte {
	b := binary.BigEndian.AppendUint64([]byte{MetaV2}, uint64(m.Since))
	return binary.BigEndian.AppendUint64(b, uint64(m.Started))
}

// SignedBytes is what a version 3 signature covers: the domain,
// the name and a 0 byte, the address (16 bytes, IPv4 mapped), the port
// (2 bytes, big endian), then member-since and run start (8 bytes each,
// big endian). An IPv4 address and its IPv4-mapped IPv6 form sign alike.
func SignedBytes(name string, addr netip.AddrPort, m Meta) []byte {
	b := make([]byte, 0, len(memberSigDomain)+len(name)+1+16+2+16)
	b = append(b, memberSigDomain...)
	b = append(b, name...)
	b = append(b, 0)
	a16 := addr.Addr().As16()
	b = append(b, a16[:]...)
	b = binary.BigEndian.AppendUint16(b, addr.Port())
	b = binary.BigEndian.AppendUint64(b, uint64(m.Since))
	return binary.BigEndian.AppendUint64(b, uint64(m.Started))
}

// SignMeta returns version 3 metadata: m signed by key for the
// member name at addr (its alive messages' address and gossip port).
func SignMeta(m Meta, name string, addr netip.AddrPort, key ed25519.PrivateKey) []byte {
	b := EncodeMeta(m)
	b[0] = MetaV3
	return append(b, ed25519.Sign(key, SignedBytes(name, addr, m))...)
}

// Errors of VerifyMeta.
var (
	ErrUnsigned  = errors.New("its metadata is not signed (an agent older than version 3 metadata, or not a node)")
	ErrSignature = errors.New("its metadata is not signed by the key the name is bound to")
)

// VerifyMeta checks that meta, a peer's metadata for member name
// at addr, is version 3 and signed by pub over that name and address,
// and returns what it says. ErrUnsigned: metadata of an earlier
// version (or none); ErrSignature: a signature by another key,
// over another address or name, or bytes that are not metadata.
func VerifyMeta(name string, addr netip.AddrPort, meta []byte, pub ed25519.PublicKey) (Meta, error) {
	if len(meta) == 0 || meta[0] < MetaV3 {
		return Meta{}, ErrUnsigned
	}
	m, ok := DecodeMeta(meta)
	if !ok || len(meta) < MetaV3Len || len(pub) != ed25519.PublicKeySize {
		return Meta{}, ErrSignature
	}
	if !ed25519.Verify(pub, SignedBytes(name, addr, m), meta[17:MetaV3Len]) {
		return Meta{}, fmt.Errorf("%w (key %s, address %s)", ErrSignature, KeyID(pub), addr)
	}
	return m, nil
}

// DecodeMeta decodes version 1, 2 or later; ok is false for anything else,
// or a time that does not fit an int64 or is not after 1970.
func DecodeMeta(b []byte) (Meta, bool) {
	var m Meta
	switch {
	case len(b) == 9 && b[0] == MetaV1:
	case len(b) >= 17 && b[0] >= MetaV2:
		// A later version starts as version 2 and adds bytes after it:
		// this build reads what it knows (an exact length would make
		// every later version unreadable to it, as version 2 is to
		// builds that read version 1 only).
		s := binary.BigEndian.Uint64(b[9:])
		if s == 0 || s > math.MaxInt64 {
			return Meta{}, false
		}
		m.Started = int64(s)
	default:
		return Meta{}, false
	}
	v := binary.BigEndian.Uint64(b[1:9])
	if v > math.MaxInt64 {
		return Meta{}, false
	}
	m.Since = int64(v)
	return m, true
}

// KeyID is a short, printable identifier of a public key: the first 16
// hex digits of its SHA-256.
func KeyID(pub []byte) string {
	if len(pub) == 0 {
		return "unsigned"
	}
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}
