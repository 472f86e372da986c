package node

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/member"
	"k8s.io/apimachinery/pkg/util/validation"
)

// checkJoinToken checks a join-token record's key and value.
func checkJoinToken(key string, value []byte) *rejection {
	id := strings.TrimPrefix(key, trust.JoinTokenKind+"/cluster/")
	if !trust.IsTokenID(id) {
		return reject(rejectKey, "join token record %q: the ID is not 6 of [a-z0-9]", key)
	}
	var t trust.JoinTokenRecord
	if err := json.Unmarshal(value, &t); err != nil {
		return reject(rejectMalformed, "%s: %v", key, err)
	}
	if len(t.SecretHash) != sha256.Size {
		return reject(rejectMalformed, "%s: the secret hash has %d bytes, not %d", key, len(t.SecretHash), sha256.Size)
	}
	if t.Expires.After(time.Now().Add(trust.MaxJoinTokenTTL + time.Hour)) {
		return reject(rejectRange, "%s: expires %s, more than %s from now", key, t.Expires.Format(time.RFC3339), trust.MaxJoinTokenTTL)
	}
	return nil
}

// checkSignature decides whether a record's signature is acceptable: it
// must be signed, the signature must verify, its signer must not be
// revoked (revoked), and it must be the key its writer's name is bound to
// (bound), if the name is bound. A record that binds a name (a node's
// first status record) is accepted from any key that is not revoked, so a
// new node can join; from then on only that key speaks for the name.
func checkSignature(r crdt.Record, bound func(name string) ([]byte, bool), revoked func(key []byte) bool) *rejection {
	if len(r.Sig) == 0 {
		return reject(rejectUnsigned, "%s: unsigned record from %q", r.Key, r.Origin)
	}
	if !crdt.VerifySignature(r) {
		return reject(rejectSignature, "%s: the signature does not verify (claimed writer %q, key %s)", r.Key, r.Origin, member.KeyID(r.Signer))
	}
	if revoked(r.Signer) {
		return reject(rejectRevoked, "%s: signed by key %s of %q, which 'starling node forget' revoked (the node needs a new identity: remove %s from its data dir)",
			r.Key, member.KeyID(r.Signer), r.Origin, trust.NodeKeyFile)
	}
	if want, ok := bound(r.Origin); ok && !bytes.Equal(want, r.Signer) {
		return reject(rejectIdentity, "%s: signed by key %s, but node %q is key %s (free the name with 'starling node forget %s' if the node was replaced)",
			r.Key, member.KeyID(r.Signer), r.Origin, member.KeyID(want), r.Origin)
	}
	return nil
}

// checkRevocation checks a revocation record's value against its key.
func checkRevocation(key string, value []byte) *rejection {
	var rv trust.Revocation
	if err := json.Unmarshal(value, &rv); err != nil {
		return reject(rejectMalformed, "%s: %v", key, err)
	}
	if len(rv.Key) != ed25519.PublicKeySize || trust.RevokedKey(rv.Key) != key {
		return reject(rejectKey, "record %q does not hold the key it names", key)
	}
	if errs := validation.IsDNS1123Label(rv.Name); len(errs) > 0 {
		return reject(rejectName, "%s: node name %q", key, rv.Name)
	}
	return nil
}
