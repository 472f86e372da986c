package api

import (
	"strings"
	"unicode/utf8"
)

// MaxReasonLen bounds, in bytes, a replica's Reason and any text a node
// publishes or logs from a peer (OneLine).
const MaxReasonLen = 4096

// OneLine replaces control characters (line breaks among them) with
// spaces and bounds s to MaxReasonLen bytes, for text this node publishes
// (a replica's Reason) or logs from a peer.
func OneLine(s string) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f || c >= 0x80 && c < 0xa0 {
			return ' '
		}
		return c
	}, s)
	if len(s) > MaxReasonLen {
		s = s[:MaxReasonLen]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}
