package crdt

import (
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// Limits enforced by Record.Validate, EncodeRecord and DecodeRecord. They bound
// what one hostile peer or one corrupted disk block can make a node allocate.
const (
	MaxKeyLen    = 512            // bytes of Record.Key
	MaxOriginLen = 255            // bytes of Record.Origin
	MaxValueLen  = 1<<20 + 64<<10 // bytes of Record.Value: 1 MiB object plus slack for JSON overhead
	// MaxEncodedLen bounds the output of EncodeRecord: fixed header, three
	// length prefixes of at most binary.MaxVarintLen32 bytes each, and the
	// Logical varint.
	MaxEncodedLen = headerLen + 4*binary.MaxVarintLen32 + MaxKeyLen + MaxOriginLen + MaxValueLen + ed25519.PublicKeySize + ed25519.SignatureSize
)

// Errors returned (wrapped, match with errors.Is) by Validate, EncodeRecord and
// DecodeRecord.
var (
	// ErrInvalidRecord: the record breaks a rule of Record.Validate.
	ErrInvalidRecord = errors.New("crdt: invalid record")
	// ErrMalformed: the bytes are not an encoding produced by EncodeRecord
	// (unknown format, truncated, trailing bytes, non-canonical numbers).
	ErrMalformed = errors.New("crdt: malformed record encoding")
)

// ValidateKey checks that key has the shape "kind/namespace/name": exactly two
// '/', three non-empty parts, at most MaxKeyLen bytes of valid UTF-8 without
// control characters. The error wraps ErrInvalidRecord.
func ValidateKey(key string) error {
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key is %d bytes, max %d", ErrInvalidRecord, len(key), MaxKeyLen)
	}
	if err := checkText(key); err != nil {
		return fmt.Errorf("%w: key %q: %v", ErrInvalidRecord, key, err)
	}
	parts := strings.Split(key, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return fmt.Errorf("%w: key %q: want kind/namespace/name", ErrInvalidRecord, key)
	}
	return nil
}

// Validate checks r against the rules every stored or transmitted record
// obeys: Key passes ValidateKey; Origin is 1 to MaxOriginLen bytes of valid
// UTF-8 without control characters; a tombstone has an empty Value; a live
// Value is at most MaxValueLen bytes and, if not empty, valid JSON. The error
// wraps ErrInvalidRecord.
func (r Record) Validate() error {
	if err := ValidateKey(r.Key); err != nil {
		return err
	}
	if r.Origin == "" || len(r.Origin) > MaxOriginLen {
		return fmt.Errorf("%w: %s: origin is %d bytes, want 1 to %d", ErrInvalidRecord, r.Key, len(r.Origin), MaxOriginLen)
	}
	if err := checkText(r.Origin); err != nil {
		return fmt.Errorf("%w: %s: origin %q: %v", ErrInvalidRecord, r.Key, r.Origin, err)
	}
	if r.Deleted && len(r.Value) > 0 {
		return fmt.Errorf("%w: %s: tombstone with a %d-byte value", ErrInvalidRecord, r.Key, len(r.Value))
	}
	if len(r.Value) > MaxValueLen {
		return fmt.Errorf("%w: %s: value is %d bytes, max %d", ErrInvalidRecord, r.Key, len(r.Value), MaxValueLen)
	}
	if len(r.Value) > 0 && !json.Valid(r.Value) {
		return fmt.Errorf("%w: %s: value is not valid JSON", ErrInvalidRecord, r.Key)
	}
	if (len(r.Signer) == 0) != (len(r.Sig) == 0) || len(r.Signer) != 0 && (len(r.Signer) != ed25519.PublicKeySize || len(r.Sig) != ed25519.SignatureSize) {
		return fmt.Errorf("%w: %s: signer of %d bytes and signature of %d bytes, want none or %d and %d", ErrInvalidRecord, r.Key,
			len(r.Signer), len(r.Sig), ed25519.PublicKeySize, ed25519.SignatureSize)
	}
	return nil
}

// signingContext separates record signatures from any other use of a
// node's key.
const signingContext = "starling record signature v1\x00"

// SigningBytes returns what a record's Sig signs: a context string, the
// format-1 encoding of the record without its signature (key, value,
// version, origin, tombstone flag) and the Signer key, so that a signature
// binds every field that decides what the record says and who says it.
// It fails like EncodeRecord.
func SigningBytes(r Record) ([]byte, error) {
	r.Sig = nil
	signer := r.Signer
	r.Signer = nil
	enc, err := EncodeRecord(r)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(signingContext)+len(enc)+len(signer))
	out = append(out, signingContext...)
	out = append(out, enc...)
	return append(out, signer...), nil
}

// Sign returns r signed with key: Signer set to key's public key and Sig
// to the signature over SigningBytes (Ed25519, RFC 8032).
func Sign(r Record, key ed25519.PrivateKey) (Record, error) {
	r.Signer = slices.Clone([]byte(key.Public().(ed25519.PublicKey)))
	msg, err := SigningBytes(r)
	if err != nil {
		return Record{}, err
	}
	r.Sig = ed25519.Sign(key, msg)
	return r, nil
}

// VerifySignature reports whether r carries a valid signature by its
// Signer. An unsigned record does not verify.
func VerifySignature(r Record) bool {
	if len(r.Signer) != ed25519.PublicKeySize || len(r.Sig) != ed25519.SignatureSize {
		return false
	}
	msg, err := SigningBytes(r)
	if err != nil {
		return false
	}
	return ed25519.Verify(ed25519.PublicKey(r.Signer), msg, r.Sig)
}

func checkText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("control character %U", c)
		}
	}
	return nil
}

// Binary encoding, formats 1 and 2. All integers big-endian or unsigned varints
// (encoding/binary), varints in their shortest form so that every record has
// exactly one encoding and equal records encode to equal bytes:
//
//	byte     format (1)
//	byte     flags: bit 0 set for a tombstone, other bits zero
//	8 bytes  Version.Wall (int64, two's complement)
//	uvarint  Version.Logical (at most math.MaxUint32)
//	uvarint  len(Key), then Key
//	uvarint  len(Origin), then Origin
//	uvarint  len(Value), then Value
//
// Format 2 is format 1 followed by the signature, for a signed record:
//
//	32 bytes Signer (Ed25519 public key)
//	64 bytes Sig
//
// An unsigned record is always written as format 1, so each record still
// has exactly one encoding.
const (
	formatV1    = 1
	formatV2    = 2
	flagDeleted = 1 << 0
	headerLen   = 1 + 1 + 8
)

// EncodeRecord returns the binary encoding of r used on disk and over the
// network, at most MaxEncodedLen bytes. It fails, with an error wrapping
// ErrInvalidRecord, for a record that does not pass Record.Validate, so that
// nothing is written that DecodeRecord would refuse.
func EncodeRecord(r Record) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	n := headerLen + 4*binary.MaxVarintLen32 + len(r.Key) + len(r.Origin) + len(r.Value) + len(r.Signer) + len(r.Sig)
	b := make([]byte, headerLen, n)
	b[0] = formatV1
	if len(r.Sig) > 0 {
		b[0] = formatV2
	}
	if r.Deleted {
		b[1] = flagDeleted
	}
	binary.BigEndian.PutUint64(b[2:], uint64(r.Version.Wall))
	b = binary.AppendUvarint(b, uint64(r.Version.Logical))
	b = appendBytes(b, r.Key)
	b = appendBytes(b, r.Origin)
	b = appendBytes(b, string(r.Value))
	if len(r.Sig) > 0 {
		b = append(b, r.Signer...)
		b = append(b, r.Sig...)
	}
	return b, nil
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// DecodeRecord parses the output of EncodeRecord. It never panics and never
// allocates more than len(b): any input that is not exactly one canonical
// encoding of a record passing Record.Validate yields an error wrapping
// ErrMalformed or ErrInvalidRecord. The returned Value does not alias b.
func DecodeRecord(b []byte) (Record, error) {
	if len(b) > MaxEncodedLen {
		return Record{}, fmt.Errorf("%w: %d bytes, max %d", ErrMalformed, len(b), MaxEncodedLen)
	}
	if len(b) < headerLen {
		return Record{}, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrMalformed, len(b), headerLen)
	}
	if b[0] != formatV1 && b[0] != formatV2 {
		return Record{}, fmt.Errorf("%w: unknown format %d", ErrMalformed, b[0])
	}
	if b[1]&^flagDeleted != 0 {
		return Record{}, fmt.Errorf("%w: unknown flags %#x", ErrMalformed, b[1])
	}
	d := NewReader(b[headerLen:], ErrMalformed)
	r := Record{
		Deleted: b[1]&flagDeleted != 0,
		Version: hlc.Timestamp{Wall: int64(binary.BigEndian.Uint64(b[2:]))},
	}
	logical := d.Uvarint("logical", math.MaxUint32)
	r.Version.Logical = uint32(logical)
	r.Key = string(d.Bytes("key", MaxKeyLen))
	r.Origin = string(d.Bytes("origin", MaxOriginLen))
	if v := d.Bytes("value", MaxValueLen); len(v) > 0 {
		r.Value = json.RawMessage(append([]byte(nil), v...))
	}
	if b[0] == formatV2 {
		if sig := d.Next("signature", ed25519.PublicKeySize+ed25519.SignatureSize); sig != nil {
			r.Signer = append([]byte(nil), sig[:ed25519.PublicKeySize]...)
			r.Sig = append([]byte(nil), sig[ed25519.PublicKeySize:]...)
		}
	}
	if err := d.Finish(); err != nil {
		return Record{}, err
	}
	if err := r.Validate(); err != nil {
		return Record{}, err
	}
	return r, nil
}
