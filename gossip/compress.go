package gossip

import (
	"fmt"

	"github.com/hashicorp/memberlist"
	"github.com/klauspost/compress/s2"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// Records sent over TCP (pulls of announced records too large for a
// packet, anti-entropy
// repairs, a writer's direct sends) are mostly node statuses and
// manifests: JSON that S2 (Snappy's successor, klauspost/compress/s2)
// shrinks about 4 times (a status listing 10 replicas: 2,892 -> 723
// bytes). Each such record goes to every node, so its size times the
// cluster's size is what a status change costs; the scale simulation's
// return of a node among 20 with 10 replicas each moved 6.4 MB
// uncompressed, 1.7 MB compressed. memberlist's own compression (LZW,
// every packet) stays off: on the small UDP packets it cost far more CPU
// than it saved. S2 rather than zstd: its functions hold no state (zstd's
// encoders are pooled behind channels, which a testing/synctest bubble
// may not share) and its block header states the decoded size, which is
// checked before anything is allocated.
//
//	records, compressed  10, S2 block of a whole records message (type 2)
//
// Only members that advertise delegate protocol version protoS2 as their
// maximum are sent it (memberlist.Node.DMax): a node of an earlier
// version gets records messages as before, so versions mix during an
// upgrade. The current version stays 0, which every version accepts.

// protoS2 is the delegate protocol version that reads msgRecordsZ.
const protoS2 = 1

// minCompressLen is the smallest records message worth compressing.
const minCompressLen = 512

// maxDecodedLen bounds what a compressed records message may expand to:
// the largest records message this package writes (a batch of about
// maxBatchLen, or one record larger than that alone). maxRatio bounds
// the expansion itself, so a few bytes cannot make a node allocate
// megabytes: a message that compresses better than that (a value of one
// repeated byte) is sent plain.
const (
	maxDecodedLen = maxBatchLen + crdt.MaxEncodedLen + 64
	maxRatio      = 64
)

// fitsRatio reports whether n decoded bytes may come from an encoded
// block of z bytes.
func fitsRatio(n, z int) bool { return n <= maxDecodedLen && n <= maxRatio*z+4096 }

// forPeer returns msg (a records message) as to should receive it:
// compressed when to reads msgRecordsZ and that makes it smaller.
func forPeer(to *memberlist.Node, msg []byte) []byte {
	if to.DMax < protoS2 || len(msg) < minCompressLen {
		return msg
	}
	z := append([]byte{byte(msgRecordsZ)}, s2.EncodeBetter(nil, msg)...)
	if len(z) >= len(msg) || !fitsRatio(len(msg), len(z)-1) {
		return msg
	}
	return z
}

// decodeRecordsZ returns the records message a compressed records message
// holds. It allocates only after the block's header says it will hold no
// more than fitsRatio allows (maxDecodedLen, and maxRatio times the
// input), and refuses anything but one S2 block of a records message.
func decodeRecordsZ(b []byte) ([]byte, error) {
	if err := checkType(b, msgRecordsZ); err != nil {
		return nil, err
	}
	n, err := s2.DecodedLen(b[1:])
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: compressed records: %v", errMalformed, err)
	case n == 0 || !fitsRatio(n, len(b)-1):
		return nil, fmt.Errorf("%w: compressed records: %d bytes decompressed from %d, want 1 to %d and at most %d times the input", errMalformed, n, len(b)-1, maxDecodedLen, maxRatio)
	}
	out, err := s2.Decode(make([]byte, n), b[1:])
	if err != nil {
		return nil, fmt.Errorf("%w: compressed records: %v", errMalformed, err)
	}
	if msgType(out[0]) != msgRecords {
		return nil, fmt.Errorf("%w: compressed records: holds no records message", errMalformed)
	}
	return out, nil
}
