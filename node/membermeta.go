package node

import (
	"encoding/binary"
	"math"
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
//
// An agent that reads only version 1 takes a version 2 node for one
// without metadata (the youngest, for arbiters) until it is upgraded.
const (
	memberMetaV1 = 1
	memberMetaV2 = 2
)

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
