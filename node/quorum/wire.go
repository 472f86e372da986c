package quorum

import (
	"encoding/binary"
	"errors"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// EncodeHist is h as a question's answer: uvarint n, then n pairs of a
// bucket byte (increasing) and a uvarint count.
func EncodeHist(h Hist) []byte {
	var pairs []byte
	n := 0
	for i, v := range h {
		if v > 0 {
			pairs = append(pairs, byte(i))
			pairs = binary.AppendUvarint(pairs, uint64(v))
			n++
		}
	}
	return append(binary.AppendUvarint(nil, uint64(n)), pairs...)
}

// errHist is wrapped by every refusal of a malformed answer.
var errHist = errors.New("malformed quorum answer")

// DecodeHist parses an answer (EncodeHist), refusing anything else:
// buckets out of range or not increasing, counts of 0 or over 1<<20,
// trailing bytes.
func DecodeHist(b []byte) (Hist, error) {
	var h Hist
	d := crdt.NewReader(b, errHist)
	n := d.Uvarint("pairs", Buckets)
	prev := -1
	for i := uint64(0); i < n && d.Err() == nil; i++ {
		k := int(d.Byte("bucket"))
		v := d.Uvarint("count", 1<<20)
		if d.Err() == nil && (k >= Buckets || k <= prev || v == 0) {
			d.Fail("buckets out of range, not increasing or empty")
		}
		if d.Err() == nil {
			h[k], prev = uint32(v), k
		}
	}
	return h, d.Finish()
}
