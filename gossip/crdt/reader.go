package crdt

import (
	"encoding/binary"
	"fmt"
)

// Reader decodes the fields of Starling's binary encodings (records here,
// gossip's wire messages): bytes, big-endian uint64s, unsigned varints in
// shortest form and length-prefixed byte strings, each bounded. After the
// first error every read returns a zero value and Err keeps that error,
// which wraps the sentinel the Reader was made with; a caller checks once
// at the end. The input is untrusted: no read allocates more than what is
// in it.
type Reader struct {
	b         []byte
	err       error
	malformed error
}

// NewReader reads b; its errors wrap malformed.
func NewReader(b []byte, malformed error) *Reader { return &Reader{b: b, malformed: malformed} }

// Fail records msg as the error, unless one was recorded already.
func (d *Reader) Fail(msg string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", d.malformed, msg)
	}
}

// Err is the first error.
func (d *Reader) Err() error { return d.err }

// Len is the number of bytes left.
func (d *Reader) Len() int { return len(d.b) }

// Next returns the next n bytes (nil and an error if fewer are left).
func (d *Reader) Next(field string, n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.Fail(fmt.Sprintf("truncated %s: want %d bytes, have %d", field, n, len(d.b)))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// Byte reads one byte.
func (d *Reader) Byte(field string) byte {
	if v := d.Next(field, 1); v != nil {
		return v[0]
	}
	return 0
}

// Uint64 reads a big-endian uint64.
func (d *Reader) Uint64(field string) uint64 {
	if v := d.Next(field, 8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// Uvarint reads an unsigned varint in its shortest form, at most limit.
func (d *Reader) Uvarint(field string, limit uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	switch {
	case n == 0:
		d.Fail("truncated " + field)
	case n < 0:
		d.Fail(field + " overflows 64 bits")
	case n != UvarintLen(v):
		d.Fail(field + " is not in shortest form")
	case v > limit:
		d.Fail(fmt.Sprintf("%s %d exceeds %d", field, v, limit))
	default:
		d.b = d.b[n:]
		return v
	}
	return 0
}

// Bytes reads a uvarint length, at most limit, then that many bytes (a
// slice of the input: copy what outlives it).
func (d *Reader) Bytes(field string, limit int) []byte {
	n := d.Uvarint(field+" length", uint64(limit))
	if d.err != nil {
		return nil
	}
	return d.Next(field, int(n))
}

// Finish returns the first error, or an error for trailing bytes.
func (d *Reader) Finish() error {
	if d.err == nil && len(d.b) > 0 {
		d.Fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	return d.err
}

// UvarintLen is the length of v's shortest uvarint encoding.
func UvarintLen(v uint64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutUvarint(buf[:], v)
}
