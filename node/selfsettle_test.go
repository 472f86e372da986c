package node

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
)

// A peer that held the asker down answers the whole --rejoin-settle,
// then what is left of it once it saw the asker back; one that never
// held it down answers 0.
func TestAnswerSettle(t *testing.T) {
	m := newMembers(Config{Name: "n1", RejoinSettle: 10 * time.Second}, nil, nil, nil, nil, false, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t0 := time.Unix(1000, 0)
	ms := func(b []byte) time.Duration { return time.Duration(binary.BigEndian.Uint32(b)) * time.Millisecond }
	if got := ms(m.answerSettle("n3", t0)); got != 0 {
		t.Fatalf("never down: %v, want 0", got)
	}
	m.AliveAfter(t0, []gossip.Member{{Name: "n1", State: gossip.StateAlive}, {Name: "n3", State: gossip.StateDead}}, nil)
	if got := ms(m.answerSettle("n3", t0.Add(time.Second))); got != 10*time.Second {
		t.Fatalf("held down: %v, want 10s", got)
	}
	m.AliveAfter(t0.Add(2*time.Second), []gossip.Member{{Name: "n1", State: gossip.StateAlive}, {Name: "n3", State: gossip.StateAlive}}, nil)
	if got := ms(m.answerSettle("n3", t0.Add(6*time.Second))); got != 6*time.Second {
		t.Fatalf("back 4 s ago: %v, want 6s", got)
	}
	if got := ms(m.answerSettle("n3", t0.Add(20*time.Second))); got != 0 {
		t.Fatalf("settled: %v, want 0", got)
	}
}

// A node that settles itself leaves itself out of placement until
// selfUntil, then counts itself again; its own membership entry never
// puts it back early.
func TestSelfSettleLeavesThisNodeOut(t *testing.T) {
	m := newMembers(Config{Name: "n3", RejoinSettle: 10 * time.Second}, nil, nil, nil, nil, false, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t0 := time.Unix(1000, 0)
	list := []gossip.Member{{Name: "n1", State: gossip.StateAlive}, {Name: "n3", State: gossip.StateAlive}}
	m.SettleSelf(t0, 10*time.Second, "n1")
	snap, _ := m.AliveAfter(t0, list, nil)
	if snap.Set["n3"] || !snap.Set["n1"] {
		t.Fatalf("settling: %v, want n1 only", snap.Set)
	}
	again, same := m.AliveAfter(t0.Add(5*time.Second), list, &snap)
	if !same || again.Set["n3"] {
		t.Fatalf("still settling: %v (same %v), want n1 only", again.Set, same)
	}
	later, same := m.AliveAfter(t0.Add(10*time.Second), list, &again)
	if same || !later.Set["n3"] || !later.Set["n1"] {
		t.Fatalf("settled: %v (same %v), want n1 and n3, changed", later.Set, same)
	}
}

// A node back before its peers found it dead is answered 0 at its join;
// a peer that finds its earlier run dead only later (its old address
// timing out under load) replaces its replicas and settles it. Asking
// again for the length of a settle leaves the node out of placement
// from that verdict on (CI: copies ran twice for 11.8 s without it).
func TestReturnedNodeTakesALateVerdict(t *testing.T) {
	t.Parallel()
	m := newMembers(Config{Name: "n3", RejoinSettle: 10 * time.Second}, nil, nil, nil, nil, false, slog.New(slog.NewTextHandler(io.Discard, nil)))
	list := []gossip.Member{{Name: "n1", State: gossip.StateAlive}, {Name: "n3", State: gossip.StateAlive}}
	asked := 0
	m.recheckSettle(context.Background(), time.Now().Add(2500*time.Millisecond), func() {
		asked++
		var d time.Duration // n1 held n3's old run up at the first questions
		if asked >= 2 {
			d = 10 * time.Second // then found it dead and replaced its replicas
		}
		m.SettleSelf(time.Now(), d, "n1")
	})
	if asked < 2 {
		t.Fatalf("asked %d times in 2.5 s, want every second", asked)
	}
	if snap, _ := m.AliveAfter(time.Now(), list, nil); snap.Set["n3"] {
		t.Fatalf("n3 counts itself while n1 settles it: %v", snap.Set)
	}
}
