package api

import (
	"errors"
	"fmt"
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

// CheckText refuses invalid UTF-8, control characters and strings longer
// than max bytes.
func CheckText(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%d bytes, at most %d", len(s), max)
	}
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f || c >= 0x80 && c < 0xa0 {
			return fmt.Errorf("control character %U", c)
		}
	}
	return nil
}

// IsSpecHash reports whether s is 8 to 64 lowercase hex digits (a spec hash).
func IsSpecHash(s string) bool {
	if len(s) < 8 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
