package quorum

import "time"

// Tracker holds one node's answers and computes its counts. An answer
// counts until it is older than the horizon; a source (a member asked
// directly, or the sibling range at one depth, whoever answers for it)
// that was silent for longer than Timeout and answers again counts only
// after Settle of answers: the two sides of a healed partition wrote
// apart, and this node takes the other side's state in that time (as a
// member back from dead counts only after --rejoin-settle). Not safe for
// concurrent use.
type Tracker struct {
	Self    Member
	Timeout time.Duration // --fence-timeout: evidence older is not fresh
	Settle  time.Duration // --rejoin-settle

	leaf   int
	direct map[string]*slot
	level  [65]slot
}

// slot is what one source said last.
type slot struct {
	id   ID
	hist Hist
	sent time.Time // when the question of the last answer was sent
	last time.Time // when the last answer arrived
	back time.Time // when answers resumed after a silence (zero: none)
}

// NewTracker returns a tracker of node self.
func NewTracker(self Member, timeout, settle time.Duration) *Tracker {
	return &Tracker{Self: self, Timeout: timeout, Settle: settle, direct: map[string]*slot{}}
}

// SetLeaf sets the leaf depth of the current round (Plan); direct
// sources outside the new leaf are forgotten.
func (t *Tracker) SetLeaf(leaf int, members []Member) {
	t.leaf = leaf
	keep := map[string]bool{}
	for _, m := range members {
		if SameRange(t.Self.ID, m.ID, leaf) {
			keep[m.Name] = true
		}
	}
	for name := range t.direct {
		if !keep[name] {
			delete(t.direct, name)
		}
	}
}

// Leaf is the leaf depth last set.
func (t *Tracker) Leaf() int { return t.leaf }

// Answer records the answer of from (of ID id) to the question at depth
// sent at sent, arriving at now: its count h, capped by the caller at
// the members it knows in that range. unheardIsSilence makes a source
// never heard before count only after Settle (an answer first heard
// while this node sees no majority may come from the majority it was cut
// off from). It reports whether the source resumed after a silence.
func (t *Tracker) Answer(depth int, from string, id ID, h Hist, sent, now time.Time, unheardIsSilence bool) bool {
	var s *slot
	switch {
	case depth == Self:
		s = t.direct[from]
		if s == nil {
			s = &slot{}
			t.direct[from] = s
		}
		h = One() // a direct answer vouches for its sender only
	case depth >= 1 && depth <= 64:
		s = &t.level[depth]
	default:
		return false
	}
	resumed := false
	if s.last.IsZero() && unheardIsSilence || !s.last.IsZero() && now.Sub(s.last) > t.Timeout {
		s.back, resumed = now, true
	}
	s.last = now
	if sent.After(s.sent) || sent.Equal(s.sent) {
		s.id, s.hist, s.sent = id, h, sent
	}
	return resumed
}

// usable reports whether s's answers count at now.
func (t *Tracker) usable(s *slot, now time.Time) bool {
	if s == nil || s.last.IsZero() {
		return false
	}
	return s.back.IsZero() || now.Sub(s.back) >= t.Settle
}

// Count is this node's count of its range at depth d at now: itself, the
// usable direct answers of its leaf inside that range (members for which
// settling reports true are left out), and below the leaf the usable
// answers for each sibling range between depth d+1 and the leaf.
func (t *Tracker) Count(d int, now time.Time, settling func(name string) bool) Hist {
	// Each answer is added aged in place (addShifted): a question is
	// answered with a count, so this runs for every question received.
	h := One()
	for name, s := range t.direct {
		if !t.usable(s, now) || !SameRange(t.Self.ID, s.id, max(d, t.leaf)) || settling != nil && settling(name) {
			continue
		}
		h.addShifted(&s.hist, now.Sub(s.sent))
	}
	for l := d + 1; l <= t.leaf; l++ {
		if s := &t.level[l]; t.usable(s, now) {
			h.addShifted(&s.hist, now.Sub(s.sent))
		}
	}
	return h
}

// Seen is the number of nodes this node has fresh evidence of (within
// Timeout) at now, itself included: its quorum count.
func (t *Tracker) Seen(now time.Time, settling func(string) bool) int {
	return t.Count(0, now, settling).Fresh(t.Timeout)
}

// Fresh reports, per source, whether it answered within Timeout at now:
// "direct/<name>" and "level/<depth>". The caller compares two calls to
// learn when a source starts or stops counting.
func (t *Tracker) Fresh(now time.Time) map[string]bool {
	out := map[string]bool{}
	for name, s := range t.direct {
		out["direct/"+name] = now.Sub(s.last) < t.Timeout
	}
	for d := 1; d <= 64; d++ {
		if s := &t.level[d]; !s.last.IsZero() {
			out["level/"+itoa(d)] = now.Sub(s.last) < t.Timeout
		}
	}
	return out
}

func itoa(d int) string {
	if d < 10 {
		return string(rune('0' + d))
	}
	return string(rune('0'+d/10)) + string(rune('0'+d%10))
}
