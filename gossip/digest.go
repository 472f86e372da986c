package gossip

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"sync"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// Anti-entropy by digest.
//
// memberlist's push/pull swaps LocalState blobs between two random nodes every
// PushPullInterval and on Join. Sending whole maps there would make idle
// traffic grow with the number of records, so LocalState is a fixed-size
// digest instead: keys are spread over numBuckets buckets by a hash of the
// key, and each bucket's hash is the XOR of recordHash over its records. Two
// nodes holding the same records have equal digests (XOR does not depend on
// order); a differing bucket means some record in it differs, with a false
// "equal" only on a 64-bit collision.
//
// When buckets differ, exactly one side acts: the node whose name sorts first
// (both sides see both digests, and acting twice would double the traffic).
// It sends a request listing the differing buckets and its entries (key,
// version, origin, deleted, hash: no values) in them. The peer runs plan over
// its own entries and the requester's, sends back in records messages what
// the requester lacks or holds older, and sends a pull naming the keys for
// which the requester's record is newer or unknown to the peer; the requester
// answers the pull with those records. Bandwidth is then proportional to the
// differing buckets, and the values actually missing.
//
// This is the classic digest-then-delta reconciliation of Demers et al.,
// "Epidemic Algorithms for Replicated Database Maintenance" (PODC 1987,
// anti-entropy with checksums), with fixed hash buckets instead of a Merkle
// tree: one level suffices at Starling's scale (thousands of objects), and a
// fixed digest keeps push/pull a single round trip.

// numBuckets is the number of hash buckets of a digest.
const numBuckets = 256

// bucketOf returns the bucket of key: the top byte of keyHash.
func bucketOf(key string) uint8 { return uint8(keyHash(key) >> 56) }

// keyHash is 64-bit FNV-1a of key passed through MurmurHash3's fmix64
// finalizer (Appleby, MurmurHash3.cpp). FNV-1a alone mixes its last input
// bytes poorly into the top bits (the final multiply by 2^40+0x1b3 moves a
// last-byte change only up to bit 47), so keys differing in their last
// characters, as object names do, would crowd into a few buckets.
func keyHash(key string) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime64
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// recordHash identifies one record exactly: the first 8 bytes of the SHA-256
// of its canonical encoding (crdt.EncodeRecord gives equal records equal
// bytes), so it covers the key, version, origin, tombstone flag and value.
func recordHash(enc []byte) uint64 {
	sum := sha256.Sum256(enc)
	return binary.BigEndian.Uint64(sum[:8])
}

// entryOf summarises r, whose encoding is enc.
func entryOf(r crdt.Record, enc []byte) entry {
	return entry{Key: r.Key, Version: r.Version, Origin: r.Origin, Deleted: r.Deleted, Hash: recordHash(enc)}
}

// compareEntries orders two entries of one key the way crdt.Record.Wins
// orders their records, as far as an entry can tell: by Version, then Origin,
// then tombstone over live. It returns 0 when only the values could decide.
func compareEntries(a, b entry) int {
	if c := a.Version.Compare(b.Version); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Origin, b.Origin); c != 0 {
		return c
	}
	switch {
	case a.Deleted == b.Deleted:
		return 0
	case a.Deleted:
		return 1
	}
	return -1
}

// plan compares the local entries and the remote ones, both sorted by key
// and of the same buckets, and returns the keys to send (local record newer,
// or unknown remotely) and the keys to pull (remote newer, or unknown
// locally). When two entries tie on everything but the value (a writer that
// reused a version), the key is in both lists: each side then applies the
// other's record and crdt.Record.Wins settles it the same way on both.
func plan(local, remote []entry) (send, pull []string) {
	i, j := 0, 0
	for i < len(local) || j < len(remote) {
		switch {
		case j == len(remote) || (i < len(local) && local[i].Key < remote[j].Key):
			send = append(send, local[i].Key)
			i++
		case i == len(local) || remote[j].Key < local[i].Key:
			pull = append(pull, remote[j].Key)
			j++
		default:
			l, r := local[i], remote[j]
			switch c := compareEntries(l, r); {
			case c > 0:
				send = append(send, l.Key)
			case c < 0:
				pull = append(pull, l.Key)
			case l.Hash != r.Hash:
				send = append(send, l.Key)
				pull = append(pull, l.Key)
			}
			i++
			j++
		}
	}
	return send, pull
}

// diffBuckets returns the buckets whose hashes differ, in increasing order.
func diffBuckets(a, b *[numBuckets]uint64) []uint8 {
	var out []uint8
	for i := range a {
		if a[i] != b[i] {
			out = append(out, uint8(i))
		}
	}
	return out
}

// index is the in-memory summary of the State that digests and requests are
// computed from: an entry per record, grouped by bucket, with each bucket's
// XOR of hashes kept up to date. It holds no values.
type index struct {
	mu      sync.RWMutex
	buckets [numBuckets]indexBucket
}

type indexBucket struct {
	sum     uint64
	entries map[string]entry
}

func newIndex() *index {
	x := &index{}
	for i := range x.buckets {
		x.buckets[i].entries = map[string]entry{}
	}
	return x
}

// put records e as the current entry of e.Key.
func (x *index) put(e entry) {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := &x.buckets[bucketOf(e.Key)]
	if old, ok := b.entries[e.Key]; ok {
		b.sum ^= old.Hash
	}
	b.entries[e.Key] = e
	b.sum ^= e.Hash
}

// get returns the entry of key.
func (x *index) get(key string) (entry, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	e, ok := x.buckets[bucketOf(key)].entries[key]
	return e, ok
}

// sums returns the digest hashes.
func (x *index) sums() [numBuckets]uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out [numBuckets]uint64
	for i := range x.buckets {
		out[i] = x.buckets[i].sum
	}
	return out
}

// len returns the number of entries.
func (x *index) len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := 0
	for i := range x.buckets {
		n += len(x.buckets[i].entries)
	}
	return n
}

// entries returns the entries of the given buckets, sorted by key.
func (x *index) entries(buckets []uint8) []entry {
	x.mu.RLock()
	var out []entry
	for _, b := range buckets {
		for _, e := range x.buckets[b].entries {
			out = append(out, e)
		}
	}
	x.mu.RUnlock()
	slices.SortFunc(out, func(a, b entry) int { return cmp.Compare(a.Key, b.Key) })
	return out
}

// reset replaces the whole index with the records of m.
func (x *index) reset(m crdt.Map) error {
	fresh := newIndex()
	for _, r := range m {
		enc, err := crdt.EncodeRecord(r)
		if err != nil {
			return err
		}
		b := &fresh.buckets[bucketOf(r.Key)]
		e := entryOf(r, enc)
		b.entries[r.Key] = e
		b.sum ^= e.Hash
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.buckets = fresh.buckets
	return nil
}
