package node

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
)

// The member's side of a join (join.go has the joining node's): join
// tokens, kept as records, and admitting a node that presents one.

// joinTokenKind is the store kind of join-token records:
// "jointoken/cluster/<token ID>" = joinTokenRecord. Tokens are written by
// 'starling join-token' and deleted by 'starling node forget' (every
// token: a forgotten node cannot come back with the one it joined with).
const joinTokenKind = "jointoken"

func joinTokenKey(id string) string { return joinTokenKind + "/cluster/" + id }

// joinTokenRecord is what the cluster keeps of a join token: the SHA-256
// of its secret (never the secret) and when it expires.
type joinTokenRecord struct {
	SecretHash []byte    `json:"secretHash"` // 32 bytes, base64 in JSON
	Expires    time.Time `json:"expires"`
}

// Bounds of a join token's lifetime.
const (
	DefaultJoinTokenTTL = 24 * time.Hour
	MaxJoinTokenTTL     = 365 * 24 * time.Hour
)

// checkJoinToken checks a join-token record's key and value.
func checkJoinToken(key string, value []byte) *rejection {
	id := strings.TrimPrefix(key, joinTokenKind+"/cluster/")
	if !isTokenID(id) {
		return reject(rejectKey, "join token record %q: the ID is not 6 of [a-z0-9]", key)
	}
	var t joinTokenRecord
	if err := json.Unmarshal(value, &t); err != nil {
		return reject(rejectMalformed, "%s: %v", key, err)
	}
	if len(t.SecretHash) != sha256.Size {
		return reject(rejectMalformed, "%s: the secret hash has %d bytes, not %d", key, len(t.SecretHash), sha256.Size)
	}
	if t.Expires.After(time.Now().Add(MaxJoinTokenTTL + time.Hour)) {
		return reject(rejectRange, "%s: expires %s, more than %s from now", key, t.Expires.Format(time.RFC3339), MaxJoinTokenTTL)
	}
	return nil
}

func isTokenID(s string) bool {
	if len(s) != 6 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune(tokenAlphabet, c) {
			return false
		}
	}
	return true
}

// admission admits new nodes (the member's side of a join) and keeps the
// join tokens: the store holds their records (read by admit), publish
// writes records (signed, gossiped), keys gives the gossip keyring to hand
// a new node. A nil *admission is a node running with --insecure.
type admission struct {
	store   Store
	id      *identity
	trust   *trust
	clock   *hlc.Clock
	self    string
	publish func(...crdt.Record) error
	keys    func() [][]byte
	log     *slog.Logger
	warn    joinWarnLimit
}

// errInsecureTokens: a node with --insecure has no CA to admit with.
var errInsecureTokens = errors.New("this cluster runs with --insecure: it has no CA and takes no join tokens; nodes join with --join and --insecure")

// createToken makes a join token valid for ttl and stores its record;
// expired ones are deleted.
func (j *admission) createToken(ttl time.Duration) (joinToken, time.Time, error) {
	if j == nil {
		return joinToken{}, time.Time{}, errInsecureTokens
	}
	if ttl < time.Minute || ttl > MaxJoinTokenTTL {
		return joinToken{}, time.Time{}, fmt.Errorf("ttl %s: must be between 1m and %s", ttl, MaxJoinTokenTTL)
	}
	tok, err := newJoinToken(caPin(j.trust.creds.CA))
	if err != nil {
		return joinToken{}, time.Time{}, err
	}
	expires := time.Now().Add(ttl).UTC().Truncate(time.Second)
	b, err := json.Marshal(joinTokenRecord{SecretHash: secretHash(tok.Secret), Expires: expires})
	if err != nil {
		return joinToken{}, time.Time{}, err
	}
	recs := []crdt.Record{{Key: joinTokenKey(tok.ID), Value: b, Version: j.clock.Now(), Origin: j.self}}
	// Expired tokens admit nobody: their records are deleted as new
	// ones are made, so they do not pile up.
	expired, err := j.tokenDeletes(func(t joinTokenRecord) bool { return time.Now().After(t.Expires) })
	if err != nil {
		return joinToken{}, time.Time{}, err
	}
	return tok, expires, j.publish(append(recs, expired...)...)
}

// deleteTokens deletes every join token record (node forget).
func (j *admission) deleteTokens() error {
	if j == nil {
		return nil
	}
	dels, err := j.tokenDeletes(func(joinTokenRecord) bool { return true })
	if err != nil {
		return err
	}
	return j.publish(dels...)
}

// tokenDeletes returns deletes of the held token records that match.
func (j *admission) tokenDeletes(match func(joinTokenRecord) bool) ([]crdt.Record, error) {
	held, err := j.store.List(joinTokenKind + "/")
	if err != nil {
		return nil, err
	}
	var dels []crdt.Record
	for _, r := range held {
		var t joinTokenRecord
		if !r.Deleted && json.Unmarshal(r.Value, &t) == nil && match(t) {
			j.clock.Update(r.Version)
			dels = append(dels, crdt.Record{Key: r.Key, Version: j.clock.Now(), Origin: j.self, Deleted: true})
		}
	}
	return dels, nil
}

// joinRefusal is why a join was refused: an HTTP status and a message for
// the joining node's operator.
type joinRefusal struct {
	status int
	msg    string
}

func (r *joinRefusal) Error() string { return r.msg }

// admitLookups are what admit reads of the cluster's state.
type admitLookups struct {
	token   func(id string) (joinTokenRecord, bool)
	bound   func(name string) ([]byte, bool)
	revoked func(key []byte) bool
}

// admit decides a join request at now: nil, or why it is refused.
func admit(req api.JoinRequest, look admitLookups, now time.Time) *joinRefusal {
	if errs := validation.IsDNS1123Label(req.Name); len(errs) > 0 {
		return &joinRefusal{http.StatusBadRequest, fmt.Sprintf("node name %q: %s (use --name with a DNS label such as node-1)", req.Name, strings.Join(errs, "; "))}
	}
	if len(req.Key) != ed25519.PublicKeySize {
		return &joinRefusal{http.StatusBadRequest, fmt.Sprintf("node key: want %d bytes, got %d", ed25519.PublicKeySize, len(req.Key))}
	}
	badToken := &joinRefusal{http.StatusForbidden, "the join token is unknown, expired or deleted (tokens are deleted by 'starling node forget'): make a new one with 'starling join-token' on a cluster node"}
	if !isTokenID(req.TokenID) {
		return badToken
	}
	t, ok := look.token(req.TokenID)
	if !ok || !now.Before(t.Expires) || subtle.ConstantTimeCompare(secretHash(req.Secret), t.SecretHash) != 1 {
		return badToken
	}
	if look.revoked(req.Key) {
		return &joinRefusal{http.StatusForbidden, fmt.Sprintf("node key %s was revoked by 'starling node forget': remove %s from the node's data dir to make a new identity", keyID(req.Key), nodeKeyFile)}
	}
	if bound, ok := look.bound(req.Name); ok && !bytes.Equal(bound, req.Key) {
		return &joinRefusal{http.StatusConflict, fmt.Sprintf("node name %q is in use by another node (key %s; this node's key is %s): start this node with another --name, or, if it replaces that node, run 'starling node forget %s' first",
			req.Name, keyID(bound), keyID(req.Key), req.Name)}
	}
	return nil
}

// tokenLookup reads a join-token record from the store.
func tokenLookup(st Store) func(id string) (joinTokenRecord, bool) {
	return func(id string) (joinTokenRecord, bool) {
		rec, ok, err := st.Get(joinTokenKey(id))
		if err != nil || !ok || rec.Deleted {
			return joinTokenRecord{}, false
		}
		var t joinTokenRecord
		if json.Unmarshal(rec.Value, &t) != nil {
			return joinTokenRecord{}, false
		}
		return t, true
	}
}

// joinWarnLimit bounds the WARNs about refused joins to one a second per
// kind of refusal (HTTP status): anyone on the LAN can knock, and a name
// conflict must not hide behind a stream of bad tokens.
type joinWarnLimit struct {
	mu   sync.Mutex
	last map[int]time.Time
}

func (l *joinWarnLimit) allow(status int, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[int]time.Time{}
	}
	if now.Sub(l.last[status]) < time.Second {
		return false
	}
	l.last[status] = now
	return true
}

// Join admits a node with a join token (the peer port's POST /v1/join;
// from is the joining node's address): the answer holds the cluster's
// credentials and the node's new certificate. A refusal is an api error
// whose status says why (403 token, 409 name in use, 400 malformed),
// logged at most once a second per kind.
func (j *admission) Join(req api.JoinRequest, from netip.Addr) (api.JoinAnswer, error) {
	if j == nil {
		return api.JoinAnswer{}, api.Errorf(http.StatusBadRequest, "this node runs with --insecure: it admits no node")
	}
	if rf := admit(req, admitLookups{token: tokenLookup(j.store), bound: j.id.boundKey, revoked: j.id.isRevoked}, time.Now()); rf != nil {
		if j.warn.allow(rf.status, time.Now()) {
			j.log.Warn("refused a node's join", "name", oneLine(req.Name), "from", from, "status", rf.status, "why", rf.msg)
		}
		return api.JoinAnswer{}, api.NewError(rf.status, rf)
	}
	creds := j.trust.creds
	cert, err := issueNodeCert(creds.CA, creds.CAKey, req.Name, req.Key, []netip.Addr{from}, time.Now())
	if err != nil {
		return api.JoinAnswer{}, err
	}
	caKey, err := x509.MarshalPKCS8PrivateKey(creds.CAKey)
	if err != nil {
		return api.JoinAnswer{}, err
	}
	j.log.Info("admitted a node", "name", req.Name, "key", keyID(req.Key), "from", from, "token", req.TokenID)
	return api.JoinAnswer{CA: creds.CA.Raw, CAKey: caKey, Cert: cert.Raw, GossipKeys: j.keys()}, nil
}

// JoinToken makes a join token (the operator's POST /v1/join-tokens).
func (j *admission) JoinToken(req api.JoinTokenRequest) (api.JoinToken, error) {
	ttl := DefaultJoinTokenTTL
	if req.TTLSeconds != 0 {
		ttl = time.Duration(req.TTLSeconds) * time.Second
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > int64(MaxJoinTokenTTL/time.Second) {
		return api.JoinToken{}, api.Errorf(http.StatusBadRequest, "ttlSeconds %d: must be between 60 and %d", req.TTLSeconds, int64(MaxJoinTokenTTL/time.Second))
	}
	tok, expires, err := j.createToken(ttl)
	if err != nil {
		status := http.StatusInternalServerError
		if j == nil || ttl < time.Minute {
			status = http.StatusBadRequest
		}
		return api.JoinToken{}, api.NewError(status, err)
	}
	j.log.Info("made a join token", "token", tok.ID, "expires", expires)
	return api.JoinToken{Token: tok.String(), Expires: expires}, nil
}
