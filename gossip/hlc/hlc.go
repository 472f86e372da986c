// Package hlc implements a hybrid logical clock (HLC).
//
// The algorithm is the one of Kulkarni, Demirbas, Madeppa, Avva and Leone,
// "Logical Physical Clocks and Consistent Snapshots in Globally Distributed
// Databases" (OPODIS 2014), figure 5: a timestamp is the largest physical time
// seen so far (Wall) plus a counter (Logical) that orders events sharing a Wall
// value. Timestamps stay close to physical time, never go backwards on a node,
// and respect causality across nodes: a receive is ordered after its send.
//
// Starling uses HLC timestamps as the versions of desired-state records, so
// "last writer wins" means "last in HLC order".
package hlc

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxOffset is how far a remote timestamp's Wall may be ahead of the local
// physical clock before Clock.Update refuses it. Without such a bound one node
// whose clock is set to the year 2100 would drag every clock in the cluster
// forward with it, and every later write from a healthy node would lose to its
// writes until real time caught up. One hour is far beyond any NTP error on a
// healthy node yet small enough to bound that damage.
const MaxOffset = time.Hour

// ErrClockOffset is matched (errors.Is) by the error Clock.Update returns for a
// remote timestamp more than MaxOffset ahead of local physical time.
var ErrClockOffset = errors.New("hlc: remote clock too far ahead")

// OffsetError is the error returned by Clock.Update for a remote timestamp
// more than MaxOffset ahead of local physical time. It matches ErrClockOffset.
type OffsetError struct {
	Remote Timestamp     // the refused timestamp
	Offset time.Duration // how far Remote.Wall is ahead of local physical time
}

func (e *OffsetError) Error() string {
	return fmt.Sprintf("%v: remote %s is %s ahead of local physical time (max %s)",
		ErrClockOffset, e.Remote, e.Offset, MaxOffset)
}

// Is makes errors.Is(err, ErrClockOffset) true.
func (e *OffsetError) Is(target error) bool { return target == ErrClockOffset }

// Timestamp orders events cluster-wide: Wall is Unix nanoseconds, Logical
// breaks ties within one Wall value. The zero Timestamp is before every
// timestamp a Clock issues.
type Timestamp struct {
	Wall    int64  `json:"wall"`
	Logical uint32 `json:"logical"`
}

// Compare returns -1 if t is before u, 0 if they are equal and +1 if t is after
// u, ordering by Wall then Logical.
func (t Timestamp) Compare(u Timestamp) int {
	switch {
	case t.Wall < u.Wall:
		return -1
	case t.Wall > u.Wall:
		return 1
	case t.Logical < u.Logical:
		return -1
	case t.Logical > u.Logical:
		return 1
	}
	return 0
}

// Less reports whether t is before u.
func (t Timestamp) Less(u Timestamp) bool { return t.Compare(u) < 0 }

// IsZero reports whether t is the zero Timestamp.
func (t Timestamp) IsZero() bool { return t == Timestamp{} }

// Time returns the physical part of t as a time.Time (Logical is dropped).
func (t Timestamp) Time() time.Time { return time.Unix(0, t.Wall) }

// String formats t as "<seconds>.<9-digit nanoseconds>,<logical>", for example
// "1732931234.123456789,3". Parse reads it back.
func (t Timestamp) String() string {
	sign := ""
	w := uint64(t.Wall)
	if t.Wall < 0 {
		sign = "-"
		w = -w // two's complement magnitude, correct for math.MinInt64 too
	}
	return fmt.Sprintf("%s%d.%09d,%d", sign, w/1e9, w%1e9, t.Logical)
}

// Parse reads a Timestamp in the format of Timestamp.String. It returns an
// error for any other input, including a Wall outside the int64 range.
func Parse(s string) (Timestamp, error) {
	wall, logical, ok := strings.Cut(s, ",")
	if !ok {
		return Timestamp{}, fmt.Errorf("hlc: parse %q: missing ','", s)
	}
	neg := strings.HasPrefix(wall, "-")
	secStr, nsStr, ok := strings.Cut(strings.TrimPrefix(wall, "-"), ".")
	if !ok || len(nsStr) != 9 || !allDigits(secStr) || !allDigits(nsStr) || !allDigits(logical) {
		return Timestamp{}, fmt.Errorf("hlc: parse %q: want <seconds>.<9 digits>,<logical>", s)
	}
	sec, err := strconv.ParseUint(secStr, 10, 64)
	if err != nil {
		return Timestamp{}, fmt.Errorf("hlc: parse %q: %w", s, err)
	}
	ns, _ := strconv.ParseUint(nsStr, 10, 64) // nine digits always fit
	l, err := strconv.ParseUint(logical, 10, 32)
	if err != nil {
		return Timestamp{}, fmt.Errorf("hlc: parse %q: %w", s, err)
	}
	limit := uint64(math.MaxInt64)
	if neg {
		limit++ // |math.MinInt64|
	}
	if sec > (limit-ns)/1e9 {
		return Timestamp{}, fmt.Errorf("hlc: parse %q: wall time out of range", s)
	}
	mag := sec*1e9 + ns
	w := int64(mag)
	if neg {
		w = int64(-mag)
	}
	return Timestamp{Wall: w, Logical: uint32(l)}, nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Clock is a hybrid logical clock. It is safe for concurrent use.
type Clock struct {
	physical func() time.Time

	mu   sync.Mutex
	last Timestamp // the largest timestamp issued or observed
}

// New returns a Clock reading physical time from physical, or from time.Now if
// physical is nil. Tests pass a fake to drive the clock deterministically.
func New(physical func() time.Time) *Clock {
	if physical == nil {
		physical = time.Now
	}
	return &Clock{physical: physical}
}

// Now returns a timestamp for a local or send event. Every result is strictly
// greater than every earlier result of Now or Update on c, even if the
// physical clock stands still or steps backwards.
func (c *Clock) Now() Timestamp {
	pt := c.physical().UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	if pt > c.last.Wall {
		c.last = Timestamp{Wall: pt}
	} else {
		c.last = tick(c.last)
	}
	return c.last
}

// Update records the receipt of remote (a timestamp from another node) and
// returns a timestamp for the receive event: strictly greater than remote and
// than every earlier result of Now or Update on c.
//
// If remote.Wall is more than MaxOffset ahead of local physical time, Update
// leaves c unchanged and returns an *OffsetError (errors.Is ErrClockOffset), so
// that a node with a broken clock cannot drag every other clock forward. The
// caller should drop or quarantine the message and report the peer.
func (c *Clock) Update(remote Timestamp) (Timestamp, error) {
	pt := c.physical().UnixNano()
	// Written as a comparison against pt+MaxOffset (saturating) rather than a
	// subtraction, which a hostile remote.Wall near math.MinInt64 would overflow.
	if limit := satAdd(pt, int64(MaxOffset)); remote.Wall > limit {
		return Timestamp{}, &OffsetError{Remote: remote, Offset: time.Duration(remote.Wall - pt)}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	last := c.last
	switch wall := max(last.Wall, remote.Wall, pt); {
	case wall == last.Wall && wall == remote.Wall:
		c.last = tick(Timestamp{Wall: wall, Logical: max(last.Logical, remote.Logical)})
	case wall == last.Wall:
		c.last = tick(last)
	case wall == remote.Wall:
		c.last = tick(remote)
	default: // physical time is ahead of both
		c.last = Timestamp{Wall: wall}
	}
	return c.last, nil
}

// Last returns the largest timestamp c has issued or observed, without
// advancing it. A node persists it as a high-water mark and feeds it back
// through Update after a restart, so that it never reissues a timestamp.
func (c *Clock) Last() Timestamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// tick returns the smallest timestamp after t. When Logical would overflow
// (2^32 events within one nanosecond of Wall, which only a clock held back by a
// far-future peer could see) it borrows one nanosecond from Wall instead; the
// order stays strict.
func tick(t Timestamp) Timestamp {
	if t.Logical == math.MaxUint32 {
		return Timestamp{Wall: t.Wall + 1}
	}
	return Timestamp{Wall: t.Wall, Logical: t.Logical + 1}
}

// satAdd returns a+b clamped to the int64 range, for b >= 0.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
