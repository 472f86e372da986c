package node

import (
	"testing"
	"time"
)

// A peer memberlist kept suspect through a whole partition never went
// dead, so no "back from dead" damping applied: the minority node counted
// it again at its first answer after the heal, regained its quorum on a
// view that lacked the majority's failover, and started an ordinal the
// majority ran (CI, TestStatefulSetAtMostOneUnderPartition: db-0 on two
// nodes for 12 s). Answers that resume after a silence count only after
// the settle time.
func TestPeerBackFromSilenceCountsOnlyAfterSettle(t *testing.T) {
	const timeout, settle = 3 * time.Second, 10 * time.Second
	t0 := time.Date(2026, 12, 1, 11, 5, 50, 0, time.UTC)
	p := newPeerAcks()
	if p.ack("n1", t0, timeout, false) {
		t.Fatal("first answer in the first round is no silence")
	}
	if !p.counts("n1", t0.Add(time.Second), timeout, settle) {
		t.Fatal("a peer answering all along counts")
	}
	for at := t0.Add(time.Second); at.Before(t0.Add(3 * time.Second)); at = at.Add(time.Second) {
		if p.ack("n1", at, timeout, false) {
			t.Fatalf("answers a second apart flagged as a silence at %v", at)
		}
	}
	// Cut: no answer for 24 s.
	if p.counts("n1", t0.Add(10*time.Second), timeout, settle) {
		t.Fatal("a silent peer counts")
	}
	heal := t0.Add(26 * time.Second)
	if !p.ack("n1", heal, timeout, false) {
		t.Fatal("the first answer after 24 s of silence must start a settle")
	}
	for at := heal; at.Before(heal.Add(settle)); at = at.Add(time.Second) {
		p.ack("n1", at, timeout, false)
		if p.counts("n1", at, timeout, settle) {
			t.Fatalf("counted %v after the heal, before the settle", at.Sub(heal))
		}
	}
	p.ack("n1", heal.Add(settle), timeout, false)
	if !p.counts("n1", heal.Add(settle), timeout, settle) {
		t.Fatal("settled peer does not count")
	}

	// An agent restarted inside a partition first hears the majority
	// after its first round, without quorum: that is a silence too.
	if !p.ack("n5", heal, timeout, true) || p.counts("n5", heal.Add(time.Second), timeout, settle) {
		t.Fatal("a peer first heard while fenced must settle")
	}
	if p.ack("n6", heal, timeout, false) || !p.counts("n6", heal.Add(time.Second), timeout, settle) {
		t.Fatal("a new peer heard while holding the quorum counts at once")
	}
}
