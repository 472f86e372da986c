package node

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/view"
)

// certifiedBy is a certifier answering with f.
type certifiedBy func(name string) bool

func (f certifiedBy) certified(name string) bool { return f(name) }

// A quorum round asks and counts nodes only: a member no certified
// record binds (a phantom a holder of the gossip key made up) is left
// out of the round and of the known nodes, and shown by
// starling_uncertified_members; once a node's record arrives it is in
// the next round, within a second, with no membership change.
func TestQuorumCountsNodesNotPhantoms(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Name = "n1"
	joined := false // n3's record has arrived
	certified := certifiedBy(func(name string) bool {
		return name == "n1" || name == "n2" || name == "n3" && joined
	})
	q := newFence(cfg, time.Now(), nil, nil, certified, prometheus.NewGauge(prometheus.GaugeOpts{Name: "u"}), newWake(), slog.New(slog.DiscardHandler))
	ms := []gossip.Member{
		{Name: "ghost-a", State: gossip.StateAlive}, {Name: "ghost-b", State: gossip.StateSuspect},
		{Name: "n1", State: gossip.StateAlive}, {Name: "n2", State: gossip.StateAlive}, {Name: "n3", State: gossip.StateAlive},
	}
	names := func() string {
		var out []string
		for _, m := range q.roundMembers(ms) {
			out = append(out, m.Name)
		}
		return strings.Join(out, " ")
	}
	if got := names(); got != "n1 n2" {
		t.Fatalf("round members %q, want the certified nodes n1 n2", got)
	}
	if got := testutil.ToFloat64(q.uncertifiedGauge); got != 3 {
		t.Fatalf("starling_uncertified_members %v, want 3 (2 phantoms, n3 joining)", got)
	}
	joined = true
	if got := names(); got != "n1 n2" {
		t.Fatalf("round members %q recomputed within a second of the last", got)
	}
	q.mu.Lock()
	q.roundAt = q.roundAt.Add(-time.Second)
	q.mu.Unlock()
	if got := names(); got != "n1 n2 n3" {
		t.Fatalf("round members %q a second later, want n3 in once its record arrived", got)
	}
	if got := testutil.ToFloat64(q.uncertifiedGauge); got != 2 {
		t.Fatalf("starling_uncertified_members %v, want the 2 phantoms", got)
	}
	// The known nodes are this node and the nodes with a record: a
	// phantom, which has none, does not dilute the majority.
	v := &view.View{Statuses: map[string]view.NodeStatus{"n1": {}, "n2": {}, "n3": {}}}
	if got := q.known(v, ms); got != 3 {
		t.Fatalf("known nodes %d with 2 phantoms in membership, want 3", got)
	}
}
