package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

// Wire format of the messages this package sends inside memberlist user
// messages (NotifyMsg) and push/pull user state (LocalState). Every message is
// one type byte then a payload. Integers are big-endian fixed width or
// unsigned varints in shortest form; strings and byte slices are a uvarint
// length then the bytes. Every decoder rejects, with an error wrapping
// errMalformed or crdt's errors, any input that is not exactly one canonical
// encoding; none panics, and none allocates more than a small multiple of its
// input.
//
//	delta    1, crdt.EncodeRecord(r)                      gossiped, re-queued by receivers it changes
//	records  2, uvarint n, n × (uvarint len, EncodeRecord) direct (TCP; one packet answering a pull), never forwarded
//	digest   3, string from, uvarint buckets (256), 256 × uint64 bucket hash
//	request  4, string from, uvarint nb, nb × byte bucket (strictly increasing),
//	            uvarint ne, ne × entry (keys strictly increasing, each in a listed bucket)
//	pull     5, string from, uvarint nk, nk × string key (strictly increasing)   direct (TCP; a packet for an announced record)
//	leave    6, string name                                gossiped, re-queued by receivers that had not seen it
//	have     7, string from, entry                         gossiped: from holds a record announced, not gossiped (AnnounceAbove)
//	records  10, S2 block of a records message             direct (TCP), to members that read it (compress.go)
//	push     11, a records message (type 2 or 10)          a writer's direct sends (TCP), to members that read it; receivers gossip on its deltas (push.go)
//
//	entry    string key, uint64 Version.Wall, uvarint Version.Logical,
//	         string origin, byte flags (bit 0: deleted), uint64 record hash

// msgType is a message's first byte: its type, as listed above.
type msgType byte

const (
	msgDelta   msgType = 1
	msgRecords msgType = 2
	msgDigest  msgType = 3
	msgRequest msgType = 4
	msgPull    msgType = 5
	msgLeave   msgType = 6
	msgHave    msgType = 7
	msgAsk     msgType = 8
	msgAnswer  msgType = 9
	// msgRecordsZ is a records message compressed (compress.go).
	msgRecordsZ msgType = 10
	// msgPush is a writer's direct send (push.go).
	msgPush msgType = 11
)

func (t msgType) String() string {
	switch t {
	case msgDelta:
		return "delta"
	case msgRecords:
		return "records"
	case msgDigest:
		return "digest"
	case msgRequest:
		return "request"
	case msgPull:
		return "pull"
	case msgLeave:
		return "leave"
	case msgHave:
		return "have"
	case msgAsk:
		return "ask"
	case msgAnswer:
		return "answer"
	case msgRecordsZ:
		return "records (compressed)"
	case msgPush:
		return "push"
	}
	return fmt.Sprintf("unknown(%d)", byte(t))
}

// errMalformed is wrapped by every decoding error of this file.
var errMalformed = errors.New("gossip: malformed message")

// errNotMember drops a message whose sender this node does not hold as a
// live member: a node joining, or one back (at a new address, or after
// being found dead) whose return has not reached this node yet. It is
// expected for a few gossip rounds, so it is logged at debug level.
var errNotMember = errors.New("gossip: the sender is not a live member here (joining, or back before its return is seen)")

const (
	// maxMessageLen is memberlist's own limit on a user message read from a
	// stream (maxUserMsgBytes in memberlist net.go); nothing larger can
	// arrive, and nothing larger is accepted.
	maxMessageLen = 20 << 20
	// maxBatchLen is the size this package aims each records, request and
	// pull message at, so that one TCP exchange stays well inside
	// maxMessageLen and TCPTimeout. A single record may exceed it.
	maxBatchLen = 4 << 20
	// minEntryLen is the smallest encoded entry: a 5-byte key "a/b/c" and a
	// 1-byte origin with their length prefixes, 8+1 version, flags, hash.
	minEntryLen = 1 + 5 + 8 + 1 + 1 + 1 + 1 + 8
	// minEncodedRecordLen is the smallest crdt.EncodeRecord output (10-byte
	// header, logical, key "a/b/c", 1-byte origin, empty value).
	minEncodedRecordLen = 10 + 1 + 6 + 2 + 1
)

// entry summarises one record for anti-entropy: enough to decide which of two
// records wins without sending values (see plan).
type entry struct {
	Key     string
	Version hlc.Timestamp
	Origin  string
	Deleted bool
	Hash    uint64 // recordHash of the record's encoding
}

// digest is the push/pull user state: one hash per key bucket.
type digest struct {
	From    string
	Buckets [numBuckets]uint64
}

// request asks the receiver to compare its entries in Buckets with Entries
// (the sender's) and send back what the sender lacks, plus a pull for what it
// lacks itself.
type request struct {
	From    string
	Buckets []uint8
	Entries []entry
}

// pull asks the receiver to send the records of Keys to From.
type pull struct {
	From string
	Keys []string
}

func encodeDelta(enc []byte) []byte {
	return append([]byte{byte(msgDelta)}, enc...)
}

// decodeDelta returns the record of a delta message and its encoding (a
// sub-slice of b).
func decodeDelta(b []byte) (crdt.Record, []byte, error) {
	if err := checkType(b, msgDelta); err != nil {
		return crdt.Record{}, nil, err
	}
	r, err := crdt.DecodeRecord(b[1:])
	if err != nil {
		return crdt.Record{}, nil, fmt.Errorf("delta: %w", err)
	}
	return r, b[1:], nil
}

// encodeRecords packs encoded records into records messages of about
// maxBatchLen bytes each (a record larger than that gets a message alone).
func encodeRecords(encs [][]byte) [][]byte {
	var out [][]byte
	for len(encs) > 0 {
		n, size := 0, 1+binary.MaxVarintLen64
		for n < len(encs) && (n == 0 || size+binary.MaxVarintLen64+len(encs[n]) <= maxBatchLen) {
			size += binary.MaxVarintLen64 + len(encs[n])
			n++
		}
		b := make([]byte, 0, size)
		b = append(b, byte(msgRecords))
		b = binary.AppendUvarint(b, uint64(n))
		for _, e := range encs[:n] {
			b = appendBytes(b, e)
		}
		out = append(out, b)
		encs = encs[n:]
	}
	return out
}

// decodeRecords returns the records of a records message and their
// encodings (sub-slices of b).
func decodeRecords(b []byte) ([]crdt.Record, [][]byte, error) {
	if err := checkType(b, msgRecords); err != nil {
		return nil, nil, err
	}
	d := newReader(b[1:])
	n := d.Uvarint("record count", uint64(d.Len()/(1+minEncodedRecordLen)))
	var recs []crdt.Record
	var encs [][]byte
	for i := uint64(0); i < n && d.Err() == nil; i++ {
		enc := d.Bytes("record", crdt.MaxEncodedLen)
		if d.Err() != nil {
			break
		}
		r, err := crdt.DecodeRecord(enc)
		if err != nil {
			return nil, nil, fmt.Errorf("records: record %d: %w", i, err)
		}
		recs = append(recs, r)
		encs = append(encs, enc)
	}
	if err := d.Finish(); err != nil {
		return nil, nil, fmt.Errorf("records: %w", err)
	}
	return recs, encs, nil
}

func encodeDigest(d digest) []byte {
	b := make([]byte, 0, digestLen(d.From))
	b = append(b, byte(msgDigest))
	b = appendBytes(b, []byte(d.From))
	b = binary.AppendUvarint(b, numBuckets)
	for _, h := range d.Buckets {
		b = binary.BigEndian.AppendUint64(b, h)
	}
	return b
}

// digestLen is the size of an encoded digest: it depends only on the sender's
// name, never on the number of records.
func digestLen(from string) int {
	return 1 + crdt.UvarintLen(uint64(len(from))) + len(from) + crdt.UvarintLen(numBuckets) + 8*numBuckets
}

func decodeDigest(b []byte) (digest, error) {
	var out digest
	if err := checkType(b, msgDigest); err != nil {
		return out, err
	}
	d := newReader(b[1:])
	out.From = d.name("from")
	if n := d.Uvarint("bucket count", math.MaxUint32); d.Err() == nil && n != numBuckets {
		// A future version could change the bucket count; digests of
		// different shapes cannot be compared.
		return digest{}, fmt.Errorf("%w: digest has %d buckets, want %d", errMalformed, n, numBuckets)
	}
	for i := range out.Buckets {
		out.Buckets[i] = d.Uint64("bucket hash")
	}
	if err := d.Finish(); err != nil {
		return digest{}, fmt.Errorf("digest: %w", err)
	}
	return out, nil
}

// entryLen is the encoded size of e.
func entryLen(e entry) int {
	return crdt.UvarintLen(uint64(len(e.Key))) + len(e.Key) + 8 + crdt.UvarintLen(uint64(e.Version.Logical)) +
		crdt.UvarintLen(uint64(len(e.Origin))) + len(e.Origin) + 1 + 8
}

// encodeRequest encodes r; Buckets and Entries must be sorted (as index
// returns them) and every entry's key in a listed bucket.
func encodeRequest(r request) []byte {
	size := 1 + binary.MaxVarintLen64*3 + len(r.From) + len(r.Buckets)
	for _, e := range r.Entries {
		size += entryLen(e)
	}
	b := make([]byte, 0, size)
	b = append(b, byte(msgRequest))
	b = appendBytes(b, []byte(r.From))
	b = binary.AppendUvarint(b, uint64(len(r.Buckets)))
	b = append(b, r.Buckets...)
	b = binary.AppendUvarint(b, uint64(len(r.Entries)))
	for _, e := range r.Entries {
		b = appendEntry(b, e)
	}
	return b
}

func appendEntry(b []byte, e entry) []byte {
	b = appendBytes(b, []byte(e.Key))
	b = binary.BigEndian.AppendUint64(b, uint64(e.Version.Wall))
	b = binary.AppendUvarint(b, uint64(e.Version.Logical))
	b = appendBytes(b, []byte(e.Origin))
	var flags byte
	if e.Deleted {
		flags = flagDeleted
	}
	b = append(b, flags)
	return binary.BigEndian.AppendUint64(b, e.Hash)
}

// entry reads one entry (appendEntry).
func (d reader) entry() entry {
	var e entry
	e.Key = d.key("key")
	e.Version.Wall = int64(d.Uint64("version wall"))
	e.Version.Logical = uint32(d.Uvarint("version logical", math.MaxUint32))
	e.Origin = d.name("origin")
	switch flags := d.Byte("flags"); {
	case d.Err() != nil:
	case flags&^flagDeleted != 0:
		d.Fail(fmt.Sprintf("unknown entry flags %#x", flags))
	default:
		e.Deleted = flags&flagDeleted != 0
	}
	e.Hash = d.Uint64("hash")
	return e
}

// have announces that From holds the record of entry E, longer than a
// delta may be (Config.AnnounceAbove): a node that lacks it pulls it
// from From.
type have struct {
	From string
	E    entry
}

func encodeHave(h have) []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen64+len(h.From)+entryLen(h.E))
	b = append(b, byte(msgHave))
	b = appendBytes(b, []byte(h.From))
	return appendEntry(b, h.E)
}

func decodeHave(b []byte) (have, error) {
	if err := checkType(b, msgHave); err != nil {
		return have{}, err
	}
	d := newReader(b[1:])
	h := have{From: d.name("from"), E: d.entry()}
	if err := d.Finish(); err != nil {
		return have{}, fmt.Errorf("have: %w", err)
	}
	return h, nil
}

const flagDeleted = 1 << 0

func decodeRequest(b []byte) (request, error) {
	var out request
	if err := checkType(b, msgRequest); err != nil {
		return out, err
	}
	d := newReader(b[1:])
	out.From = d.name("from")
	nb := d.Uvarint("bucket count", numBuckets)
	var listed [numBuckets]bool
	for i := uint64(0); i < nb && d.Err() == nil; i++ {
		bk := d.Byte("bucket")
		if d.Err() == nil && len(out.Buckets) > 0 && bk <= out.Buckets[len(out.Buckets)-1] {
			d.Fail("buckets not strictly increasing")
		}
		out.Buckets = append(out.Buckets, bk)
		listed[bk] = true
	}
	ne := d.Uvarint("entry count", uint64(d.Len()/minEntryLen))
	if d.Err() == nil && ne > 0 {
		out.Entries = make([]entry, 0, ne)
	}
	for i := uint64(0); i < ne && d.Err() == nil; i++ {
		e := d.entry()
		if d.Err() != nil {
			break
		}
		if n := len(out.Entries); n > 0 && e.Key <= out.Entries[n-1].Key {
			d.Fail("entry keys not strictly increasing")
			break
		}
		if !listed[bucketOf(e.Key)] {
			d.Fail(fmt.Sprintf("entry %q is not in a listed bucket", e.Key))
			break
		}
		out.Entries = append(out.Entries, e)
	}
	if err := d.Finish(); err != nil {
		return request{}, fmt.Errorf("request: %w", err)
	}
	return out, nil
}

// encodePull encodes p; Keys must be sorted and unique.
func encodePull(p pull) []byte {
	size := 1 + binary.MaxVarintLen64*2 + len(p.From)
	for _, k := range p.Keys {
		size += binary.MaxVarintLen64 + len(k)
	}
	b := make([]byte, 0, size)
	b = append(b, byte(msgPull))
	b = appendBytes(b, []byte(p.From))
	b = binary.AppendUvarint(b, uint64(len(p.Keys)))
	for _, k := range p.Keys {
		b = appendBytes(b, []byte(k))
	}
	return b
}

// splitPull splits keys into pull messages of about maxBatchLen bytes.
func splitPull(from string, keys []string) [][]byte {
	var out [][]byte
	for len(keys) > 0 {
		n, size := 0, 0
		for n < len(keys) && (n == 0 || size+len(keys[n]) <= maxBatchLen) {
			size += binary.MaxVarintLen64 + len(keys[n])
			n++
		}
		out = append(out, encodePull(pull{From: from, Keys: keys[:n]}))
		keys = keys[n:]
	}
	return out
}

func decodePull(b []byte) (pull, error) {
	var out pull
	if err := checkType(b, msgPull); err != nil {
		return out, err
	}
	d := newReader(b[1:])
	out.From = d.name("from")
	// The smallest key, "a/b/c", takes 6 bytes with its length.
	n := d.Uvarint("key count", uint64(d.Len()/6))
	for i := uint64(0); i < n && d.Err() == nil; i++ {
		k := d.key("key")
		if d.Err() != nil {
			break
		}
		if len(out.Keys) > 0 && k <= out.Keys[len(out.Keys)-1] {
			d.Fail("keys not strictly increasing")
			break
		}
		out.Keys = append(out.Keys, k)
	}
	if err := d.Finish(); err != nil {
		return pull{}, fmt.Errorf("pull: %w", err)
	}
	return out, nil
}

// encodeLeave encodes the intent of node name to leave. memberlist reports a
// node that left and one that died alike (NotifyLeave; the Node.State it
// passes is never set, nodeState.State shadows it), so, like serf's leave
// intent, this message tells them apart.
func encodeLeave(name string) []byte {
	return appendBytes([]byte{byte(msgLeave)}, []byte(name))
}

func decodeLeave(b []byte) (string, error) {
	if err := checkType(b, msgLeave); err != nil {
		return "", err
	}
	d := newReader(b[1:])
	name := d.name("name")
	if err := d.Finish(); err != nil {
		return "", fmt.Errorf("leave: %w", err)
	}
	return name, nil
}

func checkType(b []byte, want msgType) error {
	switch {
	case len(b) == 0:
		return fmt.Errorf("%w: empty", errMalformed)
	case len(b) > maxMessageLen:
		return fmt.Errorf("%w: %d bytes, max %d", errMalformed, len(b), maxMessageLen)
	case msgType(b[0]) != want:
		return fmt.Errorf("%w: type %v, want %v", errMalformed, msgType(b[0]), want)
	}
	return nil
}

// reader is crdt.Reader with gossip's own fields (node names, record
// keys); its errors wrap errMalformed.
type reader struct{ *crdt.Reader }

func newReader(b []byte) reader { return reader{crdt.NewReader(b, errMalformed)} }

// name reads a node name (validateName).
func (d reader) name(field string) string {
	v := d.Bytes(field, crdt.MaxOriginLen)
	if d.Err() != nil {
		return ""
	}
	if err := validateName(string(v)); err != nil {
		d.Fail(fmt.Sprintf("%s: %v", field, err))
		return ""
	}
	return string(v)
}

// key reads a record key (crdt.ValidateKey).
func (d reader) key(field string) string {
	v := d.Bytes(field, crdt.MaxKeyLen)
	if d.Err() != nil {
		return ""
	}
	if err := crdt.ValidateKey(string(v)); err != nil {
		d.Fail(fmt.Sprintf("%s: %v", field, err))
		return ""
	}
	return string(v)
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}
