// Package crdt holds Starling's replicated desired state: a map from object key
// to a last-writer-wins register (Shapiro, Preguiça, Baquero and Zawirski,
// "Conflict-free Replicated Data Types", SSS 2011, §3.2.1 LWW-Register and the
// LWW-element map built from it).
//
// Every node keeps the whole map. Any two nodes that have received the same
// set of records, in any order and with any duplication, hold identical maps,
// because Map.Apply keeps the winner (Record.Wins) of two records by a total order that does
// not depend on who applies it. The package is pure: no I/O, no clocks other
// than the ones passed in, and it knows nothing about containers.
package crdt

import (
	"bytes"
	"cmp"
	"encoding/json"
	"math"
	"slices"
	"time"

	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// Record is one entry of the desired-state map: a last-writer-wins register.
//
// Records are values; their Value bytes are shared between copies and must not
// be modified once a Record has been applied or merged anywhere.
type Record struct {
	Key     string          `json:"key"`               // "kind/namespace/name"
	Value   json.RawMessage `json:"value,omitempty"`   // the object; empty for a tombstone
	Version hlc.Timestamp   `json:"version"`           // orders writes
	Origin  string          `json:"origin"`            // node ID that wrote it; tie-break
	Deleted bool            `json:"deleted,omitempty"` // tombstone
	// Signer and Sig attribute the write: Signer is the writer's Ed25519
	// public key (32 bytes) and Sig its signature (64 bytes) over
	// SigningBytes. Both are empty for an unsigned record. They are not
	// part of the order (Wins): the layer above decides which signers it
	// trusts (crdt only checks their sizes).
	Signer []byte `json:"signer,omitempty"`
	Sig    []byte `json:"sig,omitempty"`
}

// Wins reports whether r beats other: higher Version; on equal Version the
// higher Origin (byte-wise string compare); on equal both, a tombstone beats a
// live value, then the larger Value bytes (bytes.Compare), then the larger Key.
// This is a strict total order over records (Equal records do not win over
// each other), so merge results never depend on argument order.
//
// Version and Origin alone decide in practice: an HLC timestamp plus the
// writer's node ID is unique per write. The later tie-breaks only make the
// order total when a buggy or hostile node reuses a (Version, Origin) pair;
// preferring the tombstone there errs on the side of deleting.
func (r Record) Wins(other Record) bool {
	return r.compare(other) > 0
}

func (r Record) compare(o Record) int {
	if c := r.Version.Compare(o.Version); c != 0 {
		return c
	}
	if c := cmp.Compare(r.Origin, o.Origin); c != 0 {
		return c
	}
	if r.Deleted != o.Deleted {
		if r.Deleted {
			return 1
		}
		return -1
	}
	if c := bytes.Compare(r.Value, o.Value); c != 0 {
		return c
	}
	return cmp.Compare(r.Key, o.Key)
}

// Equal reports whether r and other are the same write: all fields equal, a
// nil and an empty Value counting as equal.
func (r Record) Equal(other Record) bool { return r.compare(other) == 0 }

// Expired reports whether r is a tombstone whose Version wall time is more
// than ttl before now. Live records never expire.
//
// A tombstone may be purged only once every replica has seen it: a replica
// that still holds the older live value and meets no tombstone would bring
// the object back. ttl must therefore exceed the longest time a node can be
// partitioned away and still rejoin with its old state.
func (r Record) Expired(now time.Time, ttl time.Duration) bool {
	if !r.Deleted {
		return false
	}
	// cutoff = now - ttl, saturating, so that a hostile Version.Wall or an
	// extreme ttl cannot overflow into a wrong answer.
	n, d := now.UnixNano(), int64(ttl)
	var cutoff int64
	switch {
	case d > 0 && n < math.MinInt64+d:
		cutoff = math.MinInt64
	case d < 0 && n > math.MaxInt64+d:
		cutoff = math.MaxInt64
	default:
		cutoff = n - d
	}
	return r.Version.Wall < cutoff
}

// Map is a set of records keyed by Record.Key, a plain value type. The zero
// Map is nil: read it freely, but make one before Apply.
type Map map[string]Record

// Apply merges r into m and reports whether m changed, that is whether r's Key
// was absent or r won over the record held for it.
func (m Map) Apply(r Record) bool {
	if cur, ok := m[r.Key]; ok && !r.Wins(cur) {
		return false
	}
	m[r.Key] = r
	return true
}

// Clone returns a shallow copy of m (Values are shared); never nil.
func (m Map) Clone() Map {
	out := make(Map, len(m))
	for k, r := range m {
		out[k] = r
	}
	return out
}

// Records returns the records of m sorted by Key.
func (m Map) Records() []Record {
	out := make([]Record, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Record) int { return cmp.Compare(a.Key, b.Key) })
	return out
}
