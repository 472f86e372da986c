package damping

import (
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
)

// Answers that only restate the wait, or the remnant a peer's clock
// still counts once the wait is over, change nothing: the node does not
// stop its replicas for them.
func TestSettleSelfTakesOnlyNews(t *testing.T) {
	m := New("n3", 10*time.Second, nil)
	t0 := time.Unix(1000, 0)
	m.SettleSelf(t0, 10*time.Second, "n1")
	if !m.selfUntil.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("selfUntil %v, want t0+10s", m.selfUntil)
	}
	gen := m.gen
	m.SettleSelf(t0.Add(time.Second), 9*time.Second+300*time.Millisecond, "n2") // the same wait, measured later
	m.SettleSelf(t0.Add(5*time.Second), 30*time.Second, "n2")                   // capped at --rejoin-settle: 15 s, news
	if m.gen != gen+1 || !m.selfUntil.Equal(t0.Add(15*time.Second)) {
		t.Fatalf("gen +%d, selfUntil %v: want one change, to t0+15s", m.gen-gen, m.selfUntil)
	}
	list := []gossip.Member{{Name: "n1", State: gossip.StateAlive}, {Name: "n3", State: gossip.StateAlive}}
	m.AliveAfter(t0.Add(15*time.Second), list, nil) // the wait is over
	m.SettleSelf(t0.Add(15*time.Second), 150*time.Millisecond, "n1")
	if snap, _ := m.AliveAfter(t0.Add(15*time.Second), list, nil); !snap.Set["n3"] {
		t.Fatalf("a 150 ms remnant left n3 out again: %v", snap.Set)
	}
}
