package node

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/member"
	"github.com/starling-orchestrator/starling/node/view"
)

// certifier tells the members that are nodes: their status record,
// verified, is held (memberAuth.certified).
type certifier interface {
	certified(name string) bool
}

// memberAuth binds membership to node keys. A node signs its membership
// metadata over its name and the address and port its alive messages
// give (member.SignMeta); every node checks an alive message for a name
// its held status record binds (the record's signer, certified by the
// CA) against that key before memberlist applies it (check, the gossip
// layer's CheckAlive), and routes to a subnet only via an address its
// owner signed (SignedAddr). An impostor holding the gossip key, a join
// token or a certificate minted for the name cannot sign, so it changes
// no member's address, state or metadata on an honest node, and no
// route, whether the real node is alive, dead or restarting.
//
// The check is required of a name whose status record says MemberSig
// (written by an agent of this version); an agent that predates it is
// taken as before, unsigned, until it is upgraded (docs/real-hosts.md).
// A name no record binds yet (a node joining, whose first status record
// has not arrived) is taken unchecked: it has no subnet to route to, and
// routes check again (SignedAddr).
type memberAuth struct {
	self    string
	key     ed25519.PrivateKey
	since   int64 // member-since of this node's metadata (Unix ns)
	started int64 // this run's start (Unix ns)
	store   Store
	log     *slog.Logger
	count   *prometheus.CounterVec // starling_rejected_members_total{reason}

	// own is the address this node signed (sign).
	own atomic.Pointer[netip.AddrPort]

	mu       sync.Mutex
	bindings map[string]binding // by name, as of the status record's version
	verified map[verifiedKey]member.Meta
	logged   map[[3]string]bool
}

// binding is what a held status record says of its node's membership.
type binding struct {
	version   hlc.Timestamp
	key       []byte
	memberSig bool
	started   time.Time // the run that wrote the record (to the second)
}

// verifiedKey identifies one verified (name, address, metadata, key).
type verifiedKey struct {
	name, meta, key string
	addr            netip.AddrPort
}

// Bounds of memberAuth's caches and log keys: names and metadata come
// from peers.
const (
	maxMemberCache   = 4096
	maxMemberLogKeys = 1024
)

// Reasons counted in starling_rejected_members_total.
const (
	memberUnsigned   = "unsigned"    // no signature where the name's record says it signs
	memberSignature  = "signature"   // a signature by another key, or over another address
	memberEarlierRun = "earlier-run" // a signed message of a run older than the one held
)

func newMemberAuth(self string, key ed25519.PrivateKey, since, started int64, st Store, log *slog.Logger, count *prometheus.CounterVec) *memberAuth {
	return &memberAuth{self: self, key: key, since: since, started: started, store: st, log: log, count: count,
		bindings: map[string]binding{}, verified: map[verifiedKey]member.Meta{}, logged: map[[3]string]bool{}}
}

// sign is the gossip layer's SignMeta: this node's metadata, signed for
// addr, the address and port memberlist advertises.
func (ma *memberAuth) sign(addr netip.AddrPort) []byte {
	ma.own.Store(&addr)
	return member.SignMeta(member.Meta{Since: ma.since, Started: ma.started}, ma.self, addr, ma.key)
}

// errEarlierRun refuses an alive message of an earlier run of a node.
var errEarlierRun = errors.New("an alive message of an earlier run of the node")

// check is the gossip layer's CheckAlive (memberlist's goroutines, its
// node lock held: a store read and at most two signature checks, cached).
func (ma *memberAuth) check(a gossip.Alive) error {
	if a.Name == ma.self {
		return ma.checkOwn(a)
	}
	b, ok := ma.binding(a.Name)
	if !ok || !b.memberSig {
		return nil
	}
	m, err := ma.verify(a.Name, a.Addr, a.Meta, b.key)
	if err != nil {
		reason := memberSignature
		if errors.Is(err, member.ErrUnsigned) {
			reason = memberUnsigned
		}
		ma.refuse(a, reason, err)
		return err
	}
	// A signed message of an earlier run (replayed, or still gossiped
	// after the node restarted) would point the name back at where that
	// run was: refused when this node holds a later run's metadata, or a
	// status record the later run wrote.
	earlier := m.Started/int64(time.Second) < b.started.Unix()
	if !earlier && len(a.HeldMeta) > 0 {
		if hm, err := ma.verify(a.Name, a.HeldAddr, a.HeldMeta, b.key); err == nil && hm.Started > m.Started {
			earlier = true
		}
	}
	if earlier {
		err := fmt.Errorf("%w: %q at %s started %s, before the run this node holds", errEarlierRun, a.Name, a.Addr,
			time.Unix(0, m.Started).UTC().Format(time.RFC3339))
		ma.refuse(a, memberEarlierRun, err)
		return err
	}
	return nil
}

// checkOwn refuses an alive message for this node's own name that its
// own earlier run signed at another address (this node back at a new
// address, its old run still held alive by some peers): taken, it would
// read as another node using the name (gossip's nameTakenBy) and start
// a refutation war. Anything else about this node passes to memberlist,
// which refutes it, or reports another node using the name.
func (ma *memberAuth) checkOwn(a gossip.Alive) error {
	own := ma.own.Load()
	if own == nil || a.Addr == *own {
		return nil
	}
	m, err := ma.verify(a.Name, a.Addr, a.Meta, ma.key.Public().(ed25519.PublicKey))
	if err != nil || m.Started >= ma.started {
		return nil
	}
	ma.logOnce([3]string{a.Name, a.Addr.String(), "own"}, slog.LevelInfo,
		"ignoring the alive message of this node's earlier run at its old address (it restarted at a new one)",
		"addr", a.Addr.String(), "now", own.String())
	return errEarlierRun
}

// verify is member.VerifyMeta, cached by (name, address, metadata, key).
func (ma *memberAuth) verify(name string, addr netip.AddrPort, meta []byte, key []byte) (member.Meta, error) {
	k := verifiedKey{name: name, meta: string(meta), key: string(key), addr: addr}
	ma.mu.Lock()
	m, ok := ma.verified[k]
	ma.mu.Unlock()
	if ok {
		return m, nil
	}
	m, err := member.VerifyMeta(name, addr, meta, key)
	if err != nil {
		return m, err
	}
	ma.mu.Lock()
	putBounded(ma.verified, k, m)
	ma.mu.Unlock()
	return m, nil
}

// binding returns what the held status record of name says of its
// membership: the key that signed it, whether it signs its metadata,
// and its run's start. ok is false when no live record is held.
func (ma *memberAuth) binding(name string) (binding, bool) {
	rec, ok, err := ma.store.Get(view.StatusKey(name))
	if err != nil || !ok || rec.Deleted || len(rec.Signer) == 0 {
		return binding{}, false
	}
	ma.mu.Lock()
	b, ok := ma.bindings[name]
	ma.mu.Unlock()
	if ok && b.version == rec.Version && bytes.Equal(b.key, rec.Signer) {
		return b, true
	}
	var s struct {
		MemberSig bool      `json:"memberSig"`
		Started   time.Time `json:"started"`
	}
	if json.Unmarshal(rec.Value, &s) != nil {
		return binding{}, false
	}
	b = binding{version: rec.Version, key: rec.Signer, memberSig: s.MemberSig, started: s.Started}
	ma.mu.Lock()
	putBounded(ma.bindings, name, b)
	ma.mu.Unlock()
	return b, true
}

// certified reports whether name is a node: this one, or a name whose
// verified status record this node holds (signed by the key a CA
// certificate binds to the name; records are verified as they arrive).
// A membership entry under any other name (a phantom a holder of the
// gossip key made up, or a node whose first record has not arrived yet)
// counts for no quorum, is asked nothing and is not listed by
// `get nodes`: memberlist takes alive messages for names no record binds
// unchecked (see memberAuth), so they prove nothing. A nil memberAuth
// (tests) certifies every name.
func (ma *memberAuth) certified(name string) bool {
	if ma == nil || name == ma.self {
		return true
	}
	_, ok := ma.binding(name)
	return ok
}

// SignedAddr reports whether m's address and port are signed by the key
// of s, m's held status record (routes go only there). A node whose
// record does not say it signs (an agent that predates MemberSig) is
// taken at membership's word, as before.
func (ma *memberAuth) SignedAddr(m gossip.Member, s view.NodeStatus) bool {
	if !s.MemberSig {
		return true
	}
	ip, err := netip.ParseAddr(m.Addr)
	if err != nil {
		return false
	}
	_, err = ma.verify(m.Name, netip.AddrPortFrom(ip.Unmap(), m.Port), m.Meta, s.Signer)
	return err == nil
}

// refuse counts a refused alive message and logs it once per name,
// address and reason.
func (ma *memberAuth) refuse(a gossip.Alive, reason string, err error) {
	ma.count.WithLabelValues(reason).Inc()
	ma.logOnce([3]string{a.Name, a.Addr.String(), reason}, slog.LevelWarn,
		"refused an alive message: the name is bound to another key (an impostor, or a node given a new key without 'starling node forget'); membership, routes and endpoints stay as they were (logged once per name, address and reason; see starling_rejected_members_total)",
		"member", api.OneLine(a.Name), "addr", a.Addr.String(), "reason", reason, "err", api.OneLine(err.Error()))
}

func (ma *memberAuth) logOnce(k [3]string, level slog.Level, msg string, args ...any) {
	ma.mu.Lock()
	first := !ma.logged[k] && len(ma.logged) < maxMemberLogKeys
	if first {
		ma.logged[k] = true
	}
	ma.mu.Unlock()
	if first {
		ma.log.Log(context.Background(), level, msg, args...)
	}
}

// putBounded stores v at k in m, emptying m first when it holds
// maxMemberCache entries (a name flood costs memory once, then starts
// over).
func putBounded[K comparable, V any](m map[K]V, k K, v V) {
	if len(m) >= maxMemberCache {
		clear(m)
	}
	m[k] = v
}
