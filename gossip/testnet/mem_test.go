package testnet

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"
)

// withCRC puts memberlist's CRC header on b.
func withCRC(b []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{hasCrcMsg}, crc32.ChecksumIEEE(b)), b...)
}

func TestWithoutTakesOutOnlyTheStrippedKinds(t *testing.T) {
	alive, ping, user := []byte{4, 'a'}, []byte{0, 'p'}, []byte{userMsg, 1, 'u'}
	strip := map[byte]bool{4: true}
	for _, tc := range []struct {
		name    string
		in, out []byte
	}{
		{"alone", alive, nil},
		{"other kind", ping, ping},
		{"compound", compound(ping, alive, user), compound(ping, user)},
		{"compound of it alone", compound(alive, alive), nil},
		{"with CRC", withCRC(compound(alive, ping)), withCRC(compound(ping))},
		{"CRC of it alone", withCRC(alive), nil},
		{"truncated compound kept whole", compound(ping, alive)[:6], compound(ping, alive)[:6]},
	} {
		if got := without(tc.in, strip); !bytes.Equal(got, tc.out) || (got == nil) != (tc.out == nil) {
			t.Errorf("%s: without(%x) = %x, want %x", tc.name, tc.in, got, tc.out)
		}
	}
}
