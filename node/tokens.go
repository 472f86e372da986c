package node

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
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
	"github.com/starling-orchestrator/starling/node/member"
)

// The member's side of a join (join.go has the joining node's): admitting
// a node that presents an invitation (pki.go).

// joinTokenKind is the store kind of version 1 join-token records:
// "jointoken/cluster/<token ID>" = joinTokenRecord, written by builds
// before invitations. They admit nobody now; records still held are
// checked as before and deleted by 'starling node forget'.
const joinTokenKind = "jointoken"

func joinTokenKey(id string) string { return joinTokenKind + "/cluster/" + id }

// joinTokenRecord is what the cluster keeps of a join token: the SHA-256
// of its secret (never the secret) and when it expires.
type joinTokenRecord struct {
	SecretHash []byte    `json:"secretHash"` // 32 bytes, base64 in JSON
	Expires    time.Time `json:"expires"`
}

func isTokenID(s string) bool {
	if len(s) != 6 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("abcdefghijklmnopqrstuvwxyz0123456789", c) {
			return false
		}
	}
	return true
}

// admission admits new nodes (the member's side of a join): the store
// holds what admit reads (bound names, revocations) and the version 1
// token records that node forget deletes, publish writes records
// (signed, gossiped), keys gives the gossip keyring to hand a new node.
// A nil *admission is a node running with --insecure.
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
	ca *x509.Certificate
	// self is the pin of this member's own certificate: a request meant
	// for another member is refused.
	self    string
	bound   func(name string) ([]byte, bool)
	revoked func(key []byte) bool
	// forgotten is when name was last forgotten ('starling node
	// forget'), if ever: invitations made before then are void.
	forgotten func(name string) (time.Time, bool)
}

// admit decides a join request at now: nil, or why it is refused.
func admit(req api.JoinRequest, look admitLookups, now time.Time) *joinRefusal {
	if req.TokenID != "" || req.Secret != "" {
		return &joinRefusal{http.StatusForbidden, errTokenV1.Error()}
	}
	if errs := validation.IsDNS1123Label(req.Name); len(errs) > 0 {
		return &joinRefusal{http.StatusBadRequest, fmt.Sprintf("node name %q: %s (use --name with a DNS label such as node-1)", api.OneLine(req.Name), strings.Join(errs, "; "))}
	}
	if len(req.Key) != ed25519.PublicKeySize {
		return &joinRefusal{http.StatusBadRequest, fmt.Sprintf("node key: want %d bytes, got %d", ed25519.PublicKeySize, len(req.Key))}
	}
	badInvite := func(why string) *joinRefusal {
		return &joinRefusal{http.StatusForbidden, fmt.Sprintf("the invitation is not valid: %s; make one for this node with 'starling join-token %s' where the cluster's CA key is kept", why, req.Name)}
	}
	cert, err := x509.ParseCertificate(req.Cert)
	if err != nil {
		return badInvite("its certificate does not parse: " + err.Error())
	}
	if err := verifyNodeCert(cert, look.ca, req.Name, req.Key, now); err != nil {
		return badInvite(err.Error())
	}
	by, ok := joinDeadline(cert)
	if !ok {
		return badInvite("its certificate carries no join deadline (it is a joined node's certificate, not an invitation's)")
	}
	if d := now.Sub(time.Unix(req.Time, 0)); d > peerAuthSkew || d < -peerAuthSkew {
		return &joinRefusal{http.StatusForbidden, fmt.Sprintf("the request time is %s off this node's clock (at most %s; check the clocks)", d.Round(time.Second), peerAuthSkew)}
	}
	if len(req.Sig) != ed25519.SignatureSize || !ed25519.Verify(req.Key, joinSigningBytes(req.Name, req.Cert, req.Server, req.Time), req.Sig) {
		return badInvite("the request is not signed by the invitation's key")
	}
	if req.Server != look.self {
		return &joinRefusal{http.StatusForbidden, "the request was meant for another member (relayed?): a joining node signs its request for the member it opened TLS to"}
	}
	if now.After(by) {
		return badInvite(fmt.Sprintf("its time to join ended at %s", by.Format(time.RFC3339)))
	}
	if at, ok := look.forgotten(req.Name); ok && madeBeforeForget(cert, at) {
		return badInvite(fmt.Sprintf("it was made before 'starling node forget %s' (made %s, forgotten %s), which voids earlier invitations for the name",
			req.Name, cert.NotBefore.Add(certBackdate).UTC().Format(time.RFC3339), at.UTC().Format(time.RFC3339)))
	}
	if look.revoked(req.Key) {
		return &joinRefusal{http.StatusForbidden, fmt.Sprintf("node key %s was revoked by 'starling node forget': make a new invitation with 'starling join-token %s'", member.KeyID(req.Key), req.Name)}
	}
	if bound, ok := look.bound(req.Name); ok && !bytes.Equal(bound, req.Key) {
		return &joinRefusal{http.StatusConflict, fmt.Sprintf("node name %q is in use by another node (key %s; this node's key is %s): invite this node under another name, or, if it replaces that node, run 'starling node forget %s' first",
			req.Name, member.KeyID(bound), member.KeyID(req.Key), req.Name)}
	}
	return nil
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

// Join admits a node with an invitation (the peer port's POST /v1/join;
// from is the joining node's address): the answer holds the CA
// certificate and the gossip keys. A refusal is an api error whose status
// says why (403 invitation, 409 name in use, 400 malformed), logged at
// most once a second per kind.
func (j *admission) Join(req api.JoinRequest, from netip.Addr) (api.JoinAnswer, error) {
	if j == nil {
		return api.JoinAnswer{}, api.Errorf(http.StatusBadRequest, "this node runs with --insecure: it admits no node")
	}
	if rf := admit(req, admitLookups{ca: j.trust.creds.CA, self: spkiPin(j.trust.cert.Load()), bound: j.id.boundKey, revoked: j.id.isRevoked, forgotten: j.id.forgottenAt}, time.Now()); rf != nil {
		if j.warn.allow(rf.status, time.Now()) {
			j.log.Warn("refused a node's join", "name", api.OneLine(req.Name), "from", from, "status", rf.status, "why", rf.msg)
		}
		return api.JoinAnswer{}, api.NewError(rf.status, rf)
	}
	j.log.Info("admitted a node", "name", req.Name, "key", member.KeyID(req.Key), "from", from)
	return api.JoinAnswer{CA: j.trust.creds.CA.Raw, GossipKeys: j.keys()}, nil
}

// JoinToken answers the operator's POST /v1/join-tokens of builds before
// invitations: a node makes no join token now (it would need the CA key).
func (j *admission) JoinToken(api.JoinTokenRequest) (api.JoinToken, error) {
	return api.JoinToken{}, api.Errorf(http.StatusGone, "nodes no longer make join tokens: make an invitation with 'starling join-token NODE-NAME' where the cluster's CA key is kept (the first node, or where 'starling init' ran)")
}
