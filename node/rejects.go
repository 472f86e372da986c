package node

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/ipam"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/view"
)

// maxRejectLogKeys bounds the (writer, reason) pairs remembered for
// logging: writers' names come from peers, so the set must not grow
// without bound.
const maxRejectLogKeys = 1024

// identities is what the arrival check asks of the node identities this
// node holds (*trust.Identity): the key a name is bound to, whether a key
// is revoked, the node whose live record a key signs, and when a name
// was last forgotten.
type identities interface {
	BoundKey(name string) ([]byte, bool)
	IsRevoked(key []byte) bool
	KeyOwner(key []byte) (string, bool)
	ForgottenAt(name string) (time.Time, bool)
}

// rejects checks records received from peers (checkRecord, then the
// version against the clock, then checkSignature), counts the
// refused ones by reason in starling_rejected_records_total and logs a
// WARN once per writer and reason. It is safe for concurrent use.
type rejects struct {
	cluster netip.Prefix
	certs   *trust.CertCache // the cluster CA's verifier; nil with --insecure
	ids     identities
	// claims are the held statuses' subnet claims as of the latest view
	// (for checkTakeover), reclaimAfter how long a down node's claim
	// stays reserved (--subnet-reclaim-after).
	claims       *view.ClaimsFeed
	reclaimAfter time.Duration
	// rival is told the claim of each verified record refused as a
	// takeover of a settled subnet, for this node's claim check
	// (subnets.refused, noteRival; nil: nobody); one that finds it full
	// is dropped (the rival's record comes again).
	refused chan<- ipam.Claim
	// checked keeps what this check decoded of the statuses and desired
	// objects it accepted, for the view (view.Config.Checked).
	checked *view.Checked
	log     *slog.Logger
	count   *prometheus.CounterVec
	mu      sync.Mutex
	seen    map[[2]string]bool
	full    bool
}

func newRejects(cluster netip.Prefix, creds *trust.Credentials, ids identities,
	claims *view.ClaimsFeed, reclaimAfter time.Duration, refused chan<- ipam.Claim, log *slog.Logger, count *prometheus.CounterVec) *rejects {
	var certs *trust.CertCache
	if creds != nil {
		certs = trust.NewCertCache(creds.CA)
	}
	return &rejects{cluster: cluster, certs: certs, ids: ids, claims: claims, reclaimAfter: reclaimAfter, refused: refused, checked: view.NewChecked(),
		log: log, count: count, seen: map[[2]string]bool{}}
}

// isLive reports whether node name is alive or suspect in the
// membership of the latest view; before the first view, every node
// counts as live (no revocation is taken then).
func (x *rejects) isLive(name string) bool {
	c := x.claims.Load()
	return c == nil || c.Up(name)
}

// check is the gossip layer's Accept hook.
func (x *rejects) check(r crdt.Record) error {
	dec, rj := checkRecordWith(r, x.cluster, x.checkStatus)
	inTime := r.Version.Wall <= time.Now().Add(hlc.MaxOffset).UnixNano()
	if rj == nil && !inTime {
		// The gossip layer's clock would drop it too; refusing it here
		// counts and names it like every other refusal.
		rj = reject(rejectClock, "%s: version %s is more than %s ahead of this node's clock", r.Key, r.Version, hlc.MaxOffset)
	}
	if rj == nil {
		rj = checkSignature(r, x.ids.BoundKey, x.ids.IsRevoked)
	}
	if rj == nil {
		rj = x.checkIdentityChange(r)
	}
	if rj == nil {
		// Only now, with the clock, signature and identity checked too:
		// a copy refused here (say, re-signed by another key) must not
		// stand in the view for the record it imitates.
		dec.noteIn(x.checked, r, x.cluster)
		return nil
	}
	// A claim that only failed the takeover check (its time, signature
	// and certificate pass) is a rival the node it would displace must
	// weigh (subnetmove.go).
	if rj.rival != nil && x.refused != nil && inTime && checkSignature(r, x.ids.BoundKey, x.ids.IsRevoked) == nil && x.checkIdentityChange(r) == nil {
		select {
		case x.refused <- *rj.rival:
		default:
		}
	}
	x.note(r.Origin, rj)
	return rj
}

// checkForgotten refuses a status record that would bind a free name
// with a certificate made before the name was last forgotten: 'node
// forget' voids earlier invitations in gossip as at the join port, so
// the holder of the gossip key and an old invitation cannot bind the
// name by writing its record directly. (An invitation's join deadline
// is checked only at the join port: a record's time is its writer's.)
func (x *rejects) checkForgotten(s view.NodeStatus) *rejection {
	if _, bound := x.ids.BoundKey(s.Name); bound {
		return nil
	}
	at, ok := x.ids.ForgottenAt(s.Name)
	if !ok {
		return nil
	}
	cert, err := x509.ParseCertificate(s.Cert) // verified above
	if err != nil || trust.MadeBeforeForget(cert, at) {
		return reject(rejectRevoked, "status of node %q: its certificate was made before 'starling node forget %s' (%s), which voids it; invite the node again with 'starling join-token %s'",
			s.Name, s.Name, at.UTC().Format(time.RFC3339), s.Name)
	}
	return nil
}

// checkStatus checks what a node's status says against what this node
// holds: in a secure cluster its certificate (issued by the CA for that
// node and the record's signer), and a new or changed subnet claim
// (checkTakeover).
func (x *rejects) checkStatus(s view.NodeStatus, r crdt.Record) *rejection {
	if x.certs != nil {
		if err := x.certs.Verify(s.Cert, s.Name, r.Signer, time.Now()); err != nil {
			return reject(rejectCert, "status of node %q: %v (a node joins with 'starling join-token')", s.Name, err)
		}
		if rj := x.checkForgotten(s); rj != nil {
			return rj
		}
	}
	if s.PodSubnet == "" {
		return nil
	}
	claims := x.claims.Load()
	near := claims.Near(s)
	for _, h := range near {
		if h.Name == s.Name && view.SameClaim(h, s) {
			return nil // the claim this node already holds: nothing new
		}
	}
	return checkTakeover(s, near, func(name string) bool { return claims.Reserved(name, x.reclaimAfter) })
}

// checkTakeover refuses a new or changed subnet claim that would take a
// subnet from another node whose claim on it has settled and is still
// reserved (reserved: the node is live, or down for less than
// --subnet-reclaim-after, as ipam counts it): one that overlaps that
// claim and would beat it (ipam: the earlier claim wins).
// A claim's time is what its writer says, so without this any node could
// backdate a claim and make peers route a live node's subnet to itself.
// When two sides of a partition settle the same subnet, each side keeps
// refusing the other's claim until the node whose claim is later moves
// (the settled node it would displace learns of it from this refusal:
// rejection.rival, subnetmove.go). Claims that have not settled resolve
// as before, by time; a node that comes back with the claim it held is
// not affected (checkStatus skips a claim already held).
func checkTakeover(s view.NodeStatus, held []view.NodeStatus, reserved func(string) bool) *rejection {
	// As ipam.Lost(other, mine) for each other claim, with subnets parsed
	// once (this runs for each new claim received, over every node's).
	mine := ipam.Claim{Node: s.Name, Subnet: s.PodSubnet, Since: s.SubnetSince}
	mineP, mineOK := s.Prefix()
	for _, h := range held {
		name := h.Name
		if name == s.Name || h.PodSubnet == "" || !h.SubnetReady {
			continue
		}
		other := ipam.Claim{Node: name, Subnet: h.PodSubnet, Since: h.SubnetSince}
		otherP, otherOK := h.Prefix()
		overlaps := mineOK && otherOK && mineP.Overlaps(otherP) || (!mineOK || !otherOK) && h.PodSubnet == s.PodSubnet
		if overlaps && mine.Beats(other) && reserved(name) {
			rj := reject(rejectSubnetTaken, "node %q claims %s (time %s), which would take it from node %q (claimed at %s, settled, still reserved); a node may claim only a subnet no other node holds",
				s.Name, s.PodSubnet, s.SubnetSince, name, h.SubnetSince)
			rj.rival = &ipam.Claim{Node: s.Name, Subnet: s.PodSubnet, Since: s.SubnetSince, Settled: s.SubnetReady}
			return rj
		}
	}
	return nil
}

// checkIdentityChange guards the records that unbind a name: a node's
// status record may be deleted (which frees the name) only by the node
// itself or once the key it is bound to is revoked, which 'starling node
// forget' writes first; a revocation is accepted only for a key that is
// not a live node's, and never deleted.
func (x *rejects) checkIdentityChange(r crdt.Record) *rejection {
	kind, rest, _ := strings.Cut(r.Key, "/")
	switch {
	case kind == view.StatusKind && r.Deleted:
		name := strings.TrimPrefix(rest, "cluster/")
		key, ok := x.ids.BoundKey(name)
		if ok && !bytes.Equal(key, r.Signer) && !x.ids.IsRevoked(key) {
			return reject(rejectIdentity, "%s: delete of node %q's record by %q without a revocation of its key (use 'starling node forget', which revokes it first)", r.Key, name, r.Origin)
		}
	case kind == trust.RevokedKind && r.Deleted:
		return reject(rejectRevoked, "%s: revocations are never deleted", r.Key)
	case kind == trust.RevokedKind:
		var rv trust.Revocation
		if json.Unmarshal(r.Value, &rv) != nil {
			return reject(rejectMalformed, "%s: not a revocation", r.Key)
		}
		owner, bound := x.ids.KeyOwner(rv.Key)
		if bound && x.isLive(owner) || x.isLive(rv.Name) {
			// 'node forget' refuses a live node; a revocation of a
			// live node's key is not an operator's.
			return reject(rejectRevoked, "%s: revocation of the key of node %q, which is alive", r.Key, rv.Name)
		}
	}
	return nil
}

// note counts a refusal and logs it if this writer has not been logged
// for this reason before.
func (x *rejects) note(writer string, rj *rejection) {
	x.count.WithLabelValues(rj.reason).Inc()
	k := [2]string{writer, rj.reason}
	x.mu.Lock()
	first := !x.seen[k] && len(x.seen) < maxRejectLogKeys
	if first {
		x.seen[k] = true
	}
	overflow := !first && !x.full && len(x.seen) >= maxRejectLogKeys
	if overflow {
		x.full = true
	}
	x.mu.Unlock()
	switch {
	case first:
		x.log.Warn("refused a record from a peer (logged once per writer and reason; see starling_rejected_records_total)",
			"writer", api.OneLine(writer), "reason", rj.reason, "err", api.OneLine(rj.err.Error()))
	case overflow:
		x.log.Warn("refused records from too many writers to log each; counting only (starling_rejected_records_total)")
	}
}
