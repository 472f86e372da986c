// Package sealed seals the values of Secret records for the store and
// the wire, beyond gossip's own encryption: a node's data directory, a
// backup of it, or a record read off a peer's stream holds a Secret's
// data only as AES-256-GCM ciphertext. The rest of the Secret (its
// name, labels, type) stays in clear, as the API shows it to anyone.
//
// A sealed record is the Secret's JSON (as manifest.Encode writes it)
// without "data", with "sealedData": the base64 of a sealed value, whose
// plain text is the data's keys and values, each as a uvarint length
// and its bytes, in key order. It stays a JSON value, as records must,
// and about as long as the Secret in clear.
//
// The key is derived from the cluster's gossip key (HKDF-SHA256, RFC
// 5869, info "starling sealed secret values v1"); it is computed in
// memory and never written anywhere. A sealed value names the key it is
// sealed under (Kid, 8 bytes of the derived key's SHA-256), so a node
// opens it with any key of its keyring, the one in use or one still
// held during a rotation. The record's key is the additional data: a
// sealed value copied under another Secret's name does not open.
//
// Layout of a sealed value (bytes, before base64):
//
//	"\x00sealed1" (8) | kid (8) | nonce (12) | ciphertext and tag (len+16)
//
// The leading NUL keeps a sealed value apart from any JSON object.
package sealed

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"maps"
	"slices"

	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// magic starts every sealed value.
const magic = "\x00sealed1"

const (
	kidLen   = 8
	nonceLen = 12
	// Overhead is what sealing adds to a value's length, in bytes.
	Overhead = len(magic) + kidLen + nonceLen + 16
)

// info binds derived keys to their one use.
const info = "starling sealed secret values v1"

// Keys gives the cluster's gossip keys, the one in use first (32 bytes
// each; *gossip.Cluster). None (an --insecure cluster, whose gossip is in
// the clear too) seals nothing.
type Keys interface {
	Keys() [][]byte
}

// ErrNoKey: a sealed value names a key this node does not hold (sealed
// before a rotation this node missed, or by another cluster).
var ErrNoKey = errors.New("sealed under a key this node does not hold")

// Box seals and opens values with keys derived from Keys. Safe for
// concurrent use.
type Box struct {
	keys Keys
	mu   sync.Mutex
	aead map[string]derived // by gossip key
}

type derived struct {
	kid  [kidLen]byte
	aead cipher.AEAD
}

// New returns a Box over keys.
func New(keys Keys) *Box { return &Box{keys: keys, aead: map[string]derived{}} }

// derive returns the AEAD and key ID derived from gossip key k.
func (b *Box) derive(k []byte) (derived, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d, ok := b.aead[string(k)]; ok {
		return d, nil
	}
	key, err := hkdf.Key(sha256.New, k, nil, info, 32)
	if err != nil {
		return derived{}, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return derived{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return derived{}, err
	}
	d := derived{aead: aead}
	sum := sha256.Sum256(append([]byte("starling sealed kid\x00"), key...))
	copy(d.kid[:], sum[:kidLen])
	if len(b.aead) > 16 { // keys rotated many times: forget the old ones
		clear(b.aead)
	}
	b.aead[string(k)] = d
	return d, nil
}

// seal returns plain sealed under the key in use (keys[0]), bound to
// recordKey (the store key, "secret/NS/NAME").
func (b *Box) seal(recordKey string, key, plain []byte) ([]byte, error) {
	d, err := b.derive(key)
	if err != nil {
		return nil, fmt.Errorf("seal %s: %w", recordKey, err)
	}
	out := make([]byte, 0, len(plain)+Overhead)
	out = append(out, magic...)
	out = append(out, d.kid[:]...)
	nonce := make([]byte, nonceLen)
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal %s: %w", recordKey, err)
	}
	out = append(out, nonce...)
	return d.aead.Seal(out, nonce, plain, additional(d.kid, recordKey)), nil
}

// open returns the plain text of value, a value seal returned for
// recordKey. Errors: ErrNoKey, or a value that is cut short, altered or
// sealed for another record.
func (b *Box) open(recordKey string, value []byte) ([]byte, error) {
	if !bytes.HasPrefix(value, []byte(magic)) {
		return nil, fmt.Errorf("open %s: not a sealed value", recordKey)
	}
	if len(value) < Overhead {
		return nil, fmt.Errorf("open %s: a sealed value of %d bytes is cut short", recordKey, len(value))
	}
	kid := value[len(magic) : len(magic)+kidLen]
	for _, k := range b.keys.Keys() {
		d, err := b.derive(k)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", recordKey, err)
		}
		if !bytes.Equal(d.kid[:], kid) {
			continue
		}
		nonce := value[len(magic)+kidLen : len(magic)+kidLen+nonceLen]
		plain, err := d.aead.Open(nil, nonce, value[len(magic)+kidLen+nonceLen:], additional(d.kid, recordKey))
		if err != nil {
			return nil, fmt.Errorf("open %s: altered, or sealed for another record", recordKey)
		}
		return plain, nil
	}
	return nil, fmt.Errorf("open %s: %w (key %s)", recordKey, ErrNoKey, hex.EncodeToString(kid))
}

// additional is the data a sealed value is bound to.
func additional(kid [kidLen]byte, recordKey string) []byte {
	return append(append([]byte(magic), kid[:]...), recordKey...)
}

// envelope is a Secret record's JSON: the Secret, its data sealed in
// SealedData (encoding/json promotes the embedded Secret's fields, in
// its order, so an opened record encodes as manifest.Encode does).
type envelope struct {
	corev1.Secret
	SealedData []byte `json:"sealedData,omitempty"`
}

// Seal returns the record value of secret, a Secret's JSON, with its
// data sealed under the key in use for recordKey (the store key,
// "secret/NS/NAME"); secret itself when there is no key (--insecure).
func (b *Box) Seal(recordKey string, secret []byte) ([]byte, error) {
	keys := b.keys.Keys()
	if len(keys) == 0 {
		return secret, nil
	}
	var e envelope
	if err := json.Unmarshal(secret, &e.Secret); err != nil {
		return nil, fmt.Errorf("seal %s: %w", recordKey, err)
	}
	var plain []byte
	for _, k := range slices.Sorted(maps.Keys(e.Data)) {
		plain = binary.AppendUvarint(plain, uint64(len(k)))
		plain = append(plain, k...)
		plain = binary.AppendUvarint(plain, uint64(len(e.Data[k])))
		plain = append(plain, e.Data[k]...)
	}
	sealed, err := b.seal(recordKey, keys[0], plain)
	if err != nil {
		return nil, err
	}
	e.Data, e.SealedData = nil, sealed
	return json.Marshal(&e)
}

// Open returns the Secret's JSON of value, a record value Seal returned
// for recordKey, with its data in clear; a value with no sealed data is
// returned as it is (written by a node with no key). Errors: ErrNoKey,
// or sealed data that is cut short, altered, sealed for another record
// or malformed.
func (b *Box) Open(recordKey string, value []byte) ([]byte, error) {
	var e envelope
	if err := json.Unmarshal(value, &e); err != nil {
		// A sealedData that is not base64 is sealed data altered, not a
		// value in clear: passed on as it is, it would read as one
		// that opened.
		var fields map[string]json.RawMessage
		if json.Unmarshal(value, &fields) == nil && fields["sealedData"] != nil {
			return nil, fmt.Errorf("open %s: sealed data is malformed: %w", recordKey, err)
		}
		return value, nil // not sealed: the reader decodes (and refuses) it
	}
	if e.SealedData == nil {
		return value, nil // not sealed (--insecure)
	}
	plain, err := b.open(recordKey, e.SealedData)
	if err != nil {
		return nil, err
	}
	e.Data = map[string][]byte{}
	for len(plain) > 0 {
		var kv [2][]byte
		for i := range kv {
			n, w := binary.Uvarint(plain)
			if w <= 0 || n > uint64(len(plain)-w) {
				return nil, fmt.Errorf("open %s: sealed data is malformed", recordKey)
			}
			kv[i], plain = plain[w:w+int(n)], plain[w+int(n):]
		}
		e.Data[string(kv[0])] = kv[1]
	}
	if len(e.Data) == 0 {
		e.Data = nil
	}
	return json.Marshal(&e.Secret)
}

// Ref returns the namespace and name of the Secret a record value
// holds, sealed or not, and whether its data is sealed, without opening
// it: what the arrival check of a record can verify with no key. Errors
// name what is malformed.
func Ref(value []byte) (namespace, name string, isSealed bool, err error) {
	var e envelope
	if err := json.Unmarshal(value, &e); err != nil {
		return "", "", false, fmt.Errorf("not a Secret: %w", err)
	}
	if e.Kind != "Secret" || e.APIVersion != "v1" {
		return "", "", false, fmt.Errorf("not a v1 Secret: apiVersion %q kind %q", e.APIVersion, e.Kind)
	}
	if e.SealedData != nil && (e.Data != nil || len(e.SealedData) < Overhead || !bytes.HasPrefix(e.SealedData, []byte(magic))) {
		return "", "", false, fmt.Errorf("secret %s/%s: sealed data malformed, or beside data in clear", e.Namespace, e.Name)
	}
	return e.Namespace, e.Name, e.SealedData != nil, nil
}

// Check checks a Secret record as it arrives, with no key: value is a
// v1 Secret (Ref) of a valid namespace and name, the one recordKey
// ("secret/NS/NAME") names. Its data is checked when it is opened.
func Check(recordKey string, value []byte) error {
	ns, name, _, err := Ref(value)
	if err != nil {
		return err
	}
	if recordKey != "secret/"+ns+"/"+name {
		return fmt.Errorf("record %q holds secret %s/%s", recordKey, ns, name)
	}
	if len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return fmt.Errorf("record %q: namespace or name is not a Kubernetes name", recordKey)
	}
	return nil
}
