package trust

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

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/member"
)

// The member's side of a join (join.go has the joining node's): admitting
// a node that presents an invitation (pki.go).

// JoinTokenKind is the store kind of version 1 join-token records:
// "jointoken/cluster/<token ID>" = JoinTokenRecord, written by builds
// before invitations. They admit nobody now; records still held are
// checked as before and deleted by 'starling node forget'.
const JoinTokenKind = "jointoken"

func joinTokenKey(id string) string { return JoinTokenKind + "/cluster/" + id }

// JoinTokenRecord is what the cluster keeps of a join token: the SHA-256
// of its secret (never the secret) and when it expires.
type JoinTokenRecord struct {
	SecretHash []byte    `json:"secretHash"` // 32 bytes, base64 in JSON
	Expires    time.Time `json:"expires"`
}

func IsTokenID(s string) bool {
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

// Writer writes records: signed with the node's key, stored and
// gossiped (the agent's writer).
type Writer interface {
	PublishDurable(recs ...crdt.Record) error
}

// Admission admits new nodes (the member's side of a join): the store
// holds what admit reads (bound names, revocations) and the version 1
// token records that node forget deletes, Writer writes records,
// Cluster gives the gossip keyring to hand a new node. A nil *Admission
// is a node running with --insecure.
type Admission struct {
	Store   Records
	Id      *Identity
	Trust   *Trust
	Clock   *hlc.Clock
	Self    string
	Writer  Writer
	Cluster *gossip.Cluster
	Log     *slog.Logger
	warn    joinWarnLimit
}

// DeleteTokens deletes every join token record (node forget).
func (j *Admission) DeleteTokens() error {
	if j == nil {
		return nil
	}
	dels, err := j.tokenDeletes(func(JoinTokenRecord) bool { return true })
	if err != nil {
		return err
	}
	return j.Writer.PublishDurable(dels...)
}

// tokenDeletes returns deletes of the held token records that match.
func (j *Admission) tokenDeletes(match func(JoinTokenRecord) bool) ([]crdt.Record, error) {
	held, err := j.Store.List(JoinTokenKind + "/")
	if err != nil {
		return nil, err
	}
	var dels []crdt.Record
	for _, r := range held {
		var t JoinTokenRecord
		if !r.Deleted && json.Unmarshal(r.Value, &t) == nil && match(t) {
			j.Clock.Update(r.Version)
			dels = append(dels, crdt.Record{Key: r.Key, Version: j.Clock.Now(), Origin: j.Self, Deleted: true})
		}
	}
	return dels, nil
}

// joinRefusal is why a join was refused: an HTTP status and a message for
// the joining node's operator.
type joinRefusal struct {
	Status int
	Msg    string
}

func (r *joinRefusal) Error() string { return r.Msg }

// AdmitLookups are what admit reads of the cluster's state.
type AdmitLookups struct {
	Ca *x509.Certificate
	// Self is the pin of this member's own certificate: a request meant
	// for another member is refused.
	Self    string
	Bound   func(name string) ([]byte, bool)
	Revoked func(key []byte) bool
	// Forgotten is when name was last forgotten ('starling node
	// forget'), if ever: invitations made before then are void.
	Forgotten func(name string) (time.Time, bool)
}

// Admit decides a join request at now: nil, or why it is refused.
func Admit(req api.JoinRequest, look AdmitLookups, now time.Time) *joinRefusal {
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
	if err := VerifyNodeCert(cert, look.Ca, req.Name, req.Key, now); err != nil {
		return badInvite(err.Error())
	}
	by, ok := JoinDeadline(cert)
	if !ok {
		return badInvite("its certificate carries no join deadline (it is a joined node's certificate, not an invitation's)")
	}
	if d := now.Sub(time.Unix(req.Time, 0)); d > peerAuthSkew || d < -peerAuthSkew {
		return &joinRefusal{http.StatusForbidden, fmt.Sprintf("the request time is %s off this node's clock (at most %s; check the clocks)", d.Round(time.Second), peerAuthSkew)}
	}
	if len(req.Sig) != ed25519.SignatureSize || !ed25519.Verify(req.Key, JoinSigningBytes(req.Name, req.Cert, req.Server, req.Time), req.Sig) {
		return badInvite("the request is not signed by the invitation's key")
	}
	if req.Server != look.Self {
		return &joinRefusal{http.StatusForbidden, "the request was meant for another member (relayed?): a joining node signs its request for the member it opened TLS to"}
	}
	if now.After(by) {
		return badInvite(fmt.Sprintf("its time to join ended at %s", by.Format(time.RFC3339)))
	}
	if at, ok := look.Forgotten(req.Name); ok && MadeBeforeForget(cert, at) {
		return badInvite(fmt.Sprintf("it was made before 'starling node forget %s' (made %s, forgotten %s), which voids earlier invitations for the name",
			req.Name, cert.NotBefore.Add(certBackdate).UTC().Format(time.RFC3339), at.UTC().Format(time.RFC3339)))
	}
	if look.Revoked(req.Key) {
		return &joinRefusal{http.StatusForbidden, fmt.Sprintf("node key %s was revoked by 'starling node forget': make a new invitation with 'starling join-token %s'", member.KeyID(req.Key), req.Name)}
	}
	if bound, ok := look.Bound(req.Name); ok && !bytes.Equal(bound, req.Key) {
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
func (j *Admission) Join(req api.JoinRequest, from netip.Addr) (api.JoinAnswer, error) {
	if j == nil {
		return api.JoinAnswer{}, api.Errorf(http.StatusBadRequest, "this node runs with --insecure: it admits no node")
	}
	if rf := Admit(req, AdmitLookups{Ca: j.Trust.Creds.CA, Self: SpkiPin(j.Trust.Cert.Load()), Bound: j.Id.BoundKey, Revoked: j.Id.IsRevoked, Forgotten: j.Id.ForgottenAt}, time.Now()); rf != nil {
		if j.warn.allow(rf.Status, time.Now()) {
			j.Log.Warn("refused a node's join", "name", api.OneLine(req.Name), "from", from, "status", rf.Status, "why", rf.Msg)
		}
		return api.JoinAnswer{}, api.NewError(rf.Status, rf)
	}
	j.Log.Info("admitted a node", "name", req.Name, "key", member.KeyID(req.Key), "from", from)
	return api.JoinAnswer{CA: j.Trust.Creds.CA.Raw, GossipKeys: j.Cluster.Keys()}, nil
}

// JoinToken answers the operator's POST /v1/join-tokens of builds before
// invitations: a node makes no join token now (it would need the CA key).
func (j *Admission) JoinToken(api.JoinTokenRequest) (api.JoinToken, error) {
	return api.JoinToken{}, api.Errorf(http.StatusGone, "nodes no longer make join tokens: make an invitation with 'starling join-token NODE-NAME' where the cluster's CA key is kept (the first node, or where 'starling init' ran)")
}
