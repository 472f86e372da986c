package trust

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/view"
)

// Node identity. Every node has its own Ed25519 key pair (RFC 8032), made
// on first start and kept in <data-dir>/node.key. It signs every record
// the node writes (crdt.Sign); peers verify the signature and accept a
// record of a node's own kind (its status record) only from that node's
// key. The first key a cluster sees for a node name is the name's
// identity: a record under the name signed by another key is refused
// (reason "identity") until the name is freed with `starling node forget`.

// NodeKeyFile holds the node's private key: its 32-byte seed, base64.
const NodeKeyFile = "node.key"

// LoadOrCreateNodeKey reads the node key from DataDir, making one (mode
// 0600) on first start. A key file open to group or others is refused,
// like every secret file.
func LoadOrCreateNodeKey(dataDir string) (ed25519.PrivateKey, error) {
	path := filepath.Join(dataDir, NodeKeyFile)
	b, err := ReadSecretFile("node key", path)
	if errors.Is(err, os.ErrNotExist) {
		seed := make([]byte, ed25519.SeedSize)
		if _, err := rand.Read(seed); err != nil {
			return nil, fmt.Errorf("make node key: %w", err)
		}
		if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(seed)+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("write node key %s: %w", path, err)
		}
		return ed25519.NewKeyFromSeed(seed), nil
	}
	if err != nil {
		return nil, err
	}
	seed, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("node key %s: want a %d-byte seed in base64; remove the file to make a new identity (the cluster then needs 'starling node forget' for this node's name)", path, ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// saveNodeKey writes key as the node key in DataDir (0600), replacing a
// key the node made before it joined (an invitation brings the node's
// key).
func saveNodeKey(dataDir string, key ed25519.PrivateKey) error {
	path := filepath.Join(dataDir, NodeKeyFile)
	if err := WritePrivate(path, []byte(base64.StdEncoding.EncodeToString(key.Seed())+"\n")); err != nil {
		return fmt.Errorf("write node key %s: %w", path, err)
	}
	return nil
}

// Identity is this node's key, and what the node holds of other nodes'
// keys: which key each name is bound to, and which keys are revoked (both
// read from the store, the records being the cluster's shared view).
type Identity struct {
	Name  string
	Key   ed25519.PrivateKey
	Store Records
}

// Public is this node's public key.
func (id *Identity) Public() ed25519.PublicKey { return id.Key.Public().(ed25519.PublicKey) }

// Sign signs a record this node writes.
func (id *Identity) Sign(r crdt.Record) (crdt.Record, error) {
	return crdt.Sign(r, id.Key)
}

// BoundKey returns the key a node name is bound to on this node: the
// signer of the live status record held for it. ok is false when none is
// held (a new name, or one freed by 'starling node forget').
func (id *Identity) BoundKey(name string) ([]byte, bool) {
	rec, ok, err := id.Store.Get(view.StatusKey(name))
	if err != nil || !ok || rec.Deleted || len(rec.Signer) == 0 {
		return nil, false
	}
	return rec.Signer, true
}

// Revocation. `starling node forget NAME` frees a dead node's name and
// revokes the key it was bound to: "revoked/cluster/<key ID>" (40 hex
// digits of the key's SHA-256) = {name, key}, signed by the node that
// took the command. Revocations are never deleted. Records signed by a
// revoked key are refused, so a forgotten node cannot come back with its
// old identity; with a new key (a new node.key) it joins as a new node.

const RevokedKind = "revoked"

// Revocation is the value of a revocation record.
type Revocation struct {
	Name string `json:"name"`
	Key  []byte `json:"key"` // Ed25519 public key, base64 in JSON
}

func RevokedKey(pub []byte) string {
	sum := sha256.Sum256(pub)
	return RevokedKind + "/cluster/" + hex.EncodeToString(sum[:20])
}

// KeyOwner returns the node whose held, live status record is signed by
// pub.
func (id *Identity) KeyOwner(pub []byte) (string, bool) {
	recs, err := id.Store.List(view.StatusKind + "/")
	if err != nil {
		return "", false
	}
	for _, r := range recs {
		if !r.Deleted && bytes.Equal(r.Signer, pub) {
			return strings.TrimPrefix(r.Key, view.StatusKind+"/cluster/"), true
		}
	}
	return "", false
}

// IsRevoked reports whether this node holds a revocation of key pub.
func (id *Identity) IsRevoked(pub []byte) bool {
	rec, ok, err := id.Store.Get(RevokedKey(pub))
	return err == nil && ok && !rec.Deleted
}

// ForgottenAt is when node name was last forgotten: the latest write of
// a revocation record naming it (its HLC wall time), if any.
func (id *Identity) ForgottenAt(name string) (time.Time, bool) {
	recs, err := id.Store.List(RevokedKind + "/")
	if err != nil {
		return time.Time{}, false
	}
	var at time.Time
	for _, r := range recs {
		var rv Revocation
		if r.Deleted || json.Unmarshal(r.Value, &rv) != nil || rv.Name != name {
			continue
		}
		if t := time.Unix(0, r.Version.Wall); t.After(at) {
			at = t
		}
	}
	return at, !at.IsZero()
}

// Records is what the trust parts read of the store: records by key and
// by prefix (node's change-tracking store).
type Records interface {
	Get(key string) (crdt.Record, bool, error)
	List(prefix string) ([]crdt.Record, error)
}
