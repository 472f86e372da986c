package node

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
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
//     the 16 bytes of member-since and run start (memberSignedBytes).
//     The signature binds the address to the key the name is bound to
//     (the signer of its certified status record): peers take an alive
//     message for the name only with it (memberCheck), and route to a
//     subnet only via an address its owner signed (routes.desired).
//
// An agent that reads only version 1 takes a version 2 node for one
// without metadata (the youngest, for arbiters) until it is upgraded;
// one that reads version 2 reads version 3's first 17 bytes.
const (
	memberMetaV1 = 1
	memberMetaV2 = 2
	memberMetaV3 = 3
	// memberMetaV3Len is the length of version 3 metadata.
	memberMetaV3Len = 17 + ed25519.SignatureSize
)

// memberSigDomain separates member signatures from every other use of
// a node key (records are signed over crdt's own encoding).
const memberSigDomain = "starling member v3\x00"

// memberMeta is what a node's metadata says of it.
type memberMeta struct {
	// since is when the node first started with its data (Unix ns):
	// its age as a member (arbiters).
	since int64
	// started is when the node's current agent run started (Unix ns),
	// 0 when its metadata does not say (version 1). Peers learn it with
	// the alive message that makes the node a member again, before any
	// record it writes in that run (staleRecords).
	started int64
}

func encodeMemberMeta(m memberMeta) []byte {
	b := binary.BigEndian.AppendUint64([]byte{memberMetaV2}, uint64(m.since))
	return binary.BigEndian.AppendUint64(b, uint64(m.started))
}

// memberSignedBytes is what a version 3 signature covers: the domain,
// the name and a 0 byte, the address (16 bytes, IPv4 mapped), the port
// (2 bytes, big endian), then member-since and run start (8 bytes each,
// big endian). An IPv4 address and its IPv4-mapped IPv6 form sign alike.
func memberSignedBytes(name string, addr netip.AddrPort, m memberMeta) []byte {
	b := make([]byte, 0, len(memberSigDomain)+len(name)+1+16+2+16)
	b = append(b, memberSigDomain...)
	b = append(b, name...)
	b = append(b, 0)
	a16 := addr.Addr().As16()
	b = append(b, a16[:]...)
	b = binary.BigEndian.AppendUint16(b, addr.Port())
	b = binary.BigEndian.AppendUint64(b, uint64(m.since))
	return binary.BigEndian.AppendUint64(b, uint64(m.started))
}

// signMemberMeta returns version 3 metadata: m signed by key for the
// member name at addr (its alive messages' address and gossip port).
func signMemberMeta(m memberMeta, name string, addr netip.AddrPort, key ed25519.PrivateKey) []byte {
	b := encodeMemberMeta(m)
	b[0] = memberMetaV3
	return append(b, ed25519.Sign(key, memberSignedBytes(name, addr, m))...)
}

// Errors of verifyMemberMeta.
var (
	errMemberUnsigned  = errors.New("its metadata is not signed (an agent older than version 3 metadata, or not a node)")
	errMemberSignature = errors.New("its metadata is not signed by the key the name is bound to")
)

// verifyMemberMeta checks that meta, a peer's metadata for member name
// at addr, is version 3 and signed by pub over that name and address,
// and returns what it says. errMemberUnsigned: metadata of an earlier
// version (or none); errMemberSignature: a signature by another key,
// over another address or name, or bytes that are not metadata.
func verifyMemberMeta(name string, addr netip.AddrPort, meta []byte, pub ed25519.PublicKey) (memberMeta, error) {
	if len(meta) == 0 || meta[0] < memberMetaV3 {
		return memberMeta{}, errMemberUnsigned
	}
	m, ok := decodeMemberMeta(meta)
	if !ok || len(meta) < memberMetaV3Len || len(pub) != ed25519.PublicKeySize {
		return memberMeta{}, errMemberSignature
	}
	if !ed25519.Verify(pub, memberSignedBytes(name, addr, m), meta[17:memberMetaV3Len]) {
		return memberMeta{}, fmt.Errorf("%w (key %s, address %s)", errMemberSignature, keyID(pub), addr)
	}
	return m, nil
}

// decodeMemberMeta decodes version 1, 2 or later; ok is false for anything else,
// or a time that does not fit an int64 or is not after 1970.
func decodeMemberMeta(b []byte) (memberMeta, bool) {
	var m memberMeta
	switch {
	case len(b) == 9 && b[0] == memberMetaV1:
	case len(b) >= 17 && b[0] >= memberMetaV2:
		// A later version starts as version 2 and adds bytes after it:
		// this build reads what it knows (an exact length would make
		// every later version unreadable to it, as version 2 is to
		// builds that read version 1 only).
		s := binary.BigEndian.Uint64(b[9:])
		if s == 0 || s > math.MaxInt64 {
			return memberMeta{}, false
		}
		m.started = int64(s)
	default:
		return memberMeta{}, false
	}
	v := binary.BigEndian.Uint64(b[1:9])
	if v > math.MaxInt64 {
		return memberMeta{}, false
	}
	m.since = int64(v)
	return m, true
}

// staleRecords returns the live nodes (of alive) whose held record an
// earlier run of their agent wrote: its Started is before the run their
// metadata names. A node back from a crash is alive again, with the
// metadata of its new run, before its first record of that run reaches
// every peer (at 300 nodes, 12 s after the return, past --rejoin-settle),
// and its old record lists replicas that died with it, running since
// before the copies its peers started in its absence: taken at its word,
// placement.Keep gave them back to it and its peers stopped theirs.
// A stale record's copies are of unknown state: placement takes them as
// not running (held.go: any running copy is kept first, and with none
// the node keeps them), the rollout budget and make-before-break do not
// count them ready (rollout.go, cluster.go), get replicas and rollout
// status show them Unknown, not ready (view.reported), and they add no endpoint
// (serviceview.go; those already in rules stay: an agent restarted
// with its pods running). A node that only flapped, or was on the other
// side of a partition, keeps its run and its record stays current. A run
// started within the same second as the record's (Started is kept to the
// second) is not told apart. O(members) per view build.
func staleRecords(members []gossip.Member, alive map[string]bool, statuses map[string]NodeStatus, self string) map[string]bool {
	var out map[string]bool
	for _, m := range members {
		if m.Name == self || !alive[m.Name] {
			continue
		}
		meta, ok := decodeMemberMeta(m.Meta)
		s, held := statuses[m.Name]
		if !ok || meta.started == 0 || !held || s.Started.IsZero() {
			continue
		}
		if earlierRun(s, time.Unix(0, meta.started)) {
			if out == nil {
				out = map[string]bool{}
			}
			out[m.Name] = true
		}
	}
	return out
}
