package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// decodeAny decodes any message by its type byte and re-encodes it, for
// round-trip checks: a decoded message must re-encode to the same bytes
// (the encodings are canonical).
func decodeAny(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return nil, errMalformed
	}
	switch msgType(b[0]) {
	case msgDelta:
		_, enc, err := decodeDelta(b)
		if err != nil {
			return nil, err
		}
		return encodeDelta(enc), nil
	case msgRecords:
		_, encs, err := decodeRecords(b)
		if err != nil {
			return nil, err
		}
		if len(encs) == 0 {
			return []byte{byte(msgRecords), 0}, nil
		}
		return encodeRecords(encs)[0], nil
	case msgDigest:
		return reencode(b, decodeDigest, encodeDigest)
	case msgRequest:
		return reencode(b, decodeRequest, encodeRequest)
	case msgPull:
		return reencode(b, decodePull, encodePull)
	case msgLeave:
		return reencode(b, decodeLeave, encodeLeave)
	case msgHave:
		return reencode(b, decodeHave, encodeHave)
	case msgPush:
		inner, err := decodePush(b)
		if err != nil {
			return nil, err
		}
		if msgType(b[1]) == msgRecordsZ {
			return b, nil // compressed: FuzzDecodeRecordsZ checks that
		}
		out, err := decodeAny(inner)
		if err != nil {
			return nil, err
		}
		return encodePush(out), nil
	case msgAsk, msgAnswer:
		q, err := decodeQuestion(b, msgType(b[0]))
		if err != nil {
			return nil, err
		}
		return encodeQuestion(msgType(b[0]), q), nil
	}
	return nil, errMalformed
}

// reencode decodes b with decode and, if that succeeds, encodes the result.
func reencode[T any](b []byte, decode func([]byte) (T, error), encode func(T) []byte) ([]byte, error) {
	v, err := decode(b)
	if err != nil {
		return nil, err
	}
	return encode(v), nil
}

func TestMessagesRoundTrip(t *testing.T) {
	for _, m := range validMessages() {
		got, err := decodeAny(m)
		if err != nil {
			t.Errorf("%v: %v", msgType(m[0]), err)
			continue
		}
		if !bytes.Equal(got, m) {
			t.Errorf("%v: re-encoded differs:\n got %x\nwant %x", msgType(m[0]), got, m)
		}
	}
}

func TestDecodersRejectGarbage(t *testing.T) {
	for _, g := range garbage() {
		if _, err := decodeAny(g); err == nil {
			t.Errorf("accepted %x", g)
		} else if !errors.Is(err, errMalformed) && !errors.Is(err, crdt.ErrMalformed) && !errors.Is(err, crdt.ErrInvalidRecord) {
			t.Errorf("%x: error %v wraps neither errMalformed nor crdt's errors", g, err)
		}
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	r := crdt.Record{Key: "test/ns/a", Value: []byte(`1`), Version: hlc.Timestamp{Wall: 5}, Origin: "n00"}
	enc, _ := crdt.EncodeRecord(r)
	e := entryOf(r, enc)
	e2 := e
	e2.Key = "test/ns/b"
	other := bucketOf(e.Key) + 1
	for _, tt := range []struct {
		name string
		req  request
		want string
	}{
		{"entry outside listed buckets", request{From: "n", Buckets: []uint8{other}, Entries: []entry{e}}, "not in a listed bucket"},
		{"unsorted entries", request{From: "n", Buckets: sortedBuckets(e.Key, e2.Key), Entries: []entry{e2, e}}, "entry keys not strictly increasing"},
		{"duplicate entry", request{From: "n", Buckets: []uint8{bucketOf(e.Key)}, Entries: []entry{e, e}}, "not strictly increasing"},
		{"unsorted buckets", request{From: "n", Buckets: []uint8{9, 3}}, "buckets not strictly increasing"},
		{"bad origin", request{From: "n", Buckets: []uint8{bucketOf(e.Key)}, Entries: []entry{{Key: e.Key, Origin: ""}}}, "origin"},
		{"bad from", request{From: "", Buckets: nil}, "from"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeRequest(encodeRequest(tt.req))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

// sortedBuckets returns the distinct buckets of keys, sorted.
func sortedBuckets(keys ...string) []uint8 {
	var out []uint8
	for _, k := range keys {
		out = append(out, bucketOf(k))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func TestDecodeDigestRejectsOtherBucketCounts(t *testing.T) {
	b := encodeDigest(digest{From: "n"})
	b[3] = 0x81 // uvarint 256 is 0x80 0x02; make it 0x81 0x02 = 257
	if _, err := decodeDigest(b); err == nil {
		t.Fatal("accepted a 257-bucket digest")
	}
}

func TestDigestSizeIsFixed(t *testing.T) {
	var d digest
	d.From = "n00"
	small := len(encodeDigest(d))
	for i := range d.Buckets {
		d.Buckets[i] = ^uint64(0)
	}
	if full := len(encodeDigest(d)); full != small || full != digestLen("n00") {
		t.Fatalf("digest sizes %d, %d, digestLen %d", small, full, digestLen("n00"))
	}
}

func TestEncodeRecordsSplitsBatches(t *testing.T) {
	r := crdt.Record{Key: "test/ns/a", Value: []byte(jsonString(1 << 20)), Version: hlc.Timestamp{Wall: 5}, Origin: "n00"}
	enc, err := crdt.EncodeRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	small, _ := crdt.EncodeRecord(crdt.Record{Key: "test/ns/b", Value: []byte(`1`), Version: hlc.Timestamp{Wall: 5}, Origin: "n00"})
	encs := [][]byte{enc, enc, enc, enc, enc, small}
	msgs := encodeRecords(encs)
	if len(msgs) < 2 {
		t.Fatalf("%d messages for %d MiB, want a split", len(msgs), 5)
	}
	var got [][]byte
	for _, m := range msgs {
		if len(m) > maxBatchLen+len(enc)+16 {
			t.Errorf("message of %d bytes", len(m))
		}
		_, e, err := decodeRecords(m)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e...)
	}
	if !reflect.DeepEqual(got, encs) {
		t.Fatalf("batches carry %d records, want %d in order", len(got), len(encs))
	}
}

func TestSplitPullKeepsKeysInOrder(t *testing.T) {
	var keys []string // 20,000 keys of 214 bytes: over maxBatchLen
	for i := range 20000 {
		keys = append(keys, fmt.Sprintf("test/ns/%s%06d", strings.Repeat("k", 200), i))
	}
	var got []string
	msgs := splitPull("n00", keys)
	for _, m := range msgs {
		p, err := decodePull(m)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p.Keys...)
	}
	if !reflect.DeepEqual(got, keys) {
		t.Fatalf("pulls carry %d keys, want %d", len(got), len(keys))
	}
}
