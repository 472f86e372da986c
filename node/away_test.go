package node

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/member"
	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/placement"
)

// where maps each running replica of the workloads named prefix* to its
// node.
func where(nodes []*testNode, prefix string) map[string]string {
	out := map[string]string{}
	for _, n := range nodes {
		for _, id := range n.rt.ids() {
			if strings.Contains(id, "_"+prefix) {
				out[id] = n.name
			}
		}
	}
	return out
}

// A node that returns takes back only what its peers cannot keep under
// their load bound (placement.Keep): each move restarts a replica and
// sends the cluster two or more records. Here 5 nodes run 8 Deployments
// of 2 replicas; a node's 3 or 4 go to the other 4; when it is back, the
// bound is 4 replicas a node (16 x 1.25 / 5): replicas move only off a
// node that holds more, and only to the returning node. Before Keep,
// rendezvous hashing moved its whole share back and bounded loads moved
// more between the others.
func TestReturningNodeTakesBackOnlyWhatItsPeersCannotKeep(t *testing.T) {
	const bound = 4
	nodes := startCluster(t, 5)
	for i := range 8 {
		deploy(t, nodes[0], fmt.Sprintf("keep%d", i), 2, "img:v1")
	}
	all := func(ns []*testNode) error {
		for i := range 8 {
			if err := runningEverywhere(ns, fmt.Sprintf("keep%d", i), 2); err != nil {
				return err
			}
		}
		return nil
	}
	waitFor(t, 30*time.Second, func() error { return all(nodes) })
	gone := nodes[4]
	gone.stop()
	waitFor(t, 30*time.Second, func() error { return all(nodes[:4]) })
	before := where(nodes[:4], "keep")
	load := map[string]int{}
	for _, n := range before {
		load[n]++
	}
	excess := 0
	for _, l := range load {
		excess += max(0, l-bound)
	}

	back := start(t, gone.name, gone.dir, []string{nodes[0].addr()})
	now := append(nodes[:4:4], back)
	check := func() error {
		if err := all(now); err != nil {
			return err
		}
		var bad []string
		took := 0
		for id, n := range where(now, "keep") {
			switch from := before[id]; {
			case n == from:
			case n != back.name || load[from] <= bound:
				bad = append(bad, fmt.Sprintf("%s from %s (%d replicas) to %s", id, from, load[from], n))
			default:
				took++
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("replicas moved that their node could keep: %s", strings.Join(bad, ", "))
		}
		if took != excess {
			return fmt.Errorf("the returning node took %d replicas, want the %d over the bound of %d (loads %v)", took, excess, bound, load)
		}
		return nil
	}
	waitFor(t, 30*time.Second, check)
	// Settled: the returning node's view holds every record; still so.
	time.Sleep(3 * time.Second)
	if err := check(); err != nil {
		t.Fatal(err)
	}
	back.rt.mu.Lock()
	created := back.rt.created
	back.rt.mu.Unlock()
	t.Logf("loads before the return %v: the returning node took back the %d replicas over the bound of %d (it created %d)", load, excess, bound, created)
}

// Only copies that are not being stopped or failing to be created count,
// on eligible nodes, and only for replicas that run away from
// placement's choice; the index reads a record again when it or
// placement changed.
func TestAwayListsCopiesAwayFromTheirOwner(t *testing.T) {
	nodes := []placement.Node{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	ws := []placement.Workload{{Key: "default/web", Replicas: 3}}
	p := placement.Assign(nodes, ws, placement.Options{})
	owner := p.Owner("default/web", 0)
	away := map[string]string{"a": "b", "b": "c", "c": "a"}[owner]
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rep := func(ord int, phase api.Phase) api.Replica {
		return api.Replica{Namespace: "default", Workload: "web", Ordinal: ord, Phase: phase, Created: t0}
	}
	statuses := map[string]view.NodeStatus{
		owner:  {Replicas: []api.Replica{rep(0, api.PhaseRunning)}},
		away:   {Replicas: []api.Replica{rep(0, api.PhaseContainerCreating), rep(1, api.PhaseCreateBackOff), rep(2, api.PhaseTerminating)}},
		"gone": {Replicas: []api.Replica{rep(1, api.PhaseRunning)}}, // not eligible
	}
	var x view.AwayIndex
	byNode := func(hs []placement.Holder) map[string]placement.Holder {
		out := map[string]placement.Holder{}
		for _, h := range hs {
			out[h.Node] = h
		}
		return out
	}
	got := x.Elsewhere(false, p, p, nodes, statuses, nil)
	if m := byNode(got); len(got) != 2 || !m[owner].Running || m[away].Running || m[away].Ordinal != 0 || !m[away].Since.Equal(t0) {
		t.Fatalf("want the two copies of ordinal 0, the owner's running, the one on %s being created: %+v", away, got)
	}
	if again := x.Elsewhere(false, p, p, nodes, statuses, nil); !view.SameHolders(again, got) {
		t.Fatalf("no record changed: %+v, want %+v", again, got)
	}
	statuses[away] = view.NodeStatus{Replicas: []api.Replica{rep(1, api.PhaseCreateBackOff), rep(2, api.PhaseTerminating)}}
	if got := x.Elsewhere(false, p, p, nodes, statuses, nil); len(got) != 0 {
		t.Fatalf("copies failing to be created or being stopped hold nothing: %+v", got)
	}
	// A Replace lists the new copy Pending: it still holds the replica.
	statuses[away] = view.NodeStatus{Replicas: []api.Replica{rep(0, api.PhasePending)}}
	if got := x.Elsewhere(false, p, p, nodes, statuses, nil); len(got) != 2 {
		t.Fatalf("a copy being replaced on %s: %+v", away, got)
	}
	// Placement changed (computed anew) and gives ordinal 0 to the node that
	// holds it: nothing is away, with the same records.
	statuses[owner] = view.NodeStatus{}
	if got := x.Elsewhere(false, p, p, nodes, statuses, nil); len(got) != 1 {
		t.Fatalf("only %s holds ordinal 0: %+v", away, got)
	}
	p2 := placement.Placement{Owners: map[string][]string{"default/web": slices.Clone(p.Owners["default/web"])}}
	p2.Owners["default/web"][0] = away
	if got := x.Elsewhere(true, p2, p2, nodes, statuses, nil); got != nil {
		t.Fatalf("placement gives ordinal 0 to %s, which runs it: %+v", away, got)
	}
	if got := awayElsewhere(p, p, nodes[:0], statuses); got != nil {
		t.Fatalf("no node eligible: %+v", got)
	}
}

// The scan each derive makes of the replicas the nodes list: 1,000 nodes
// of 10 replicas each, all where placement puts them.
func BenchmarkAwayElsewhere1000Nodes(b *testing.B) {
	var nodes []placement.Node
	for i := range 1000 {
		nodes = append(nodes, placement.Node{Name: fmt.Sprintf("n%04d", i)})
	}
	var ws []placement.Workload
	for i := range 100 {
		ws = append(ws, placement.Workload{Key: fmt.Sprintf("default/sim-%03d", i), Replicas: 100})
	}
	p := placement.Assign(nodes, ws, placement.Options{})
	statuses := map[string]view.NodeStatus{}
	for key, owners := range p.Owners {
		for ord, o := range owners {
			s := statuses[o]
			s.Replicas = append(s.Replicas, api.Replica{Namespace: "default", Workload: strings.TrimPrefix(key, "default/"), Ordinal: ord, Phase: api.PhaseRunning})
			s.Version = hlc.Timestamp{Wall: 1}
			statuses[o] = s
		}
	}
	b.Run("every record read", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if got := awayElsewhere(p, p, nodes, statuses); got != nil {
				b.Fatalf("%d away, want none", len(got))
			}
		}
	})
	// A quarter of the replicas run on the next node instead (kept
	// there after failures).
	moved := map[string]view.NodeStatus{}
	for i, n := range nodes {
		for j, r := range statuses[n.Name].Replicas {
			to := n.Name
			if j%4 == 0 {
				to = nodes[(i+1)%len(nodes)].Name
			}
			s := moved[to]
			s.Replicas, s.Version = append(s.Replicas, r), hlc.Timestamp{Wall: 1}
			moved[to] = s
		}
	}
	b.Run("a quarter away, one record changed", func(b *testing.B) {
		var x view.AwayIndex
		want := len(x.Elsewhere(false, p, p, nodes, moved, nil))
		b.ReportAllocs()
		for b.Loop() {
			s := moved["n0007"]
			s.Replicas, s.Version.Wall = slices.Clone(s.Replicas), s.Version.Wall+1
			moved["n0007"] = s
			if got := x.Elsewhere(false, p, p, nodes, moved, nil); len(got) != want {
				b.Fatalf("%d away, want %d", len(got), want)
			}
		}
	})
	b.Run("one record changed", func(b *testing.B) {
		var x view.AwayIndex
		x.Elsewhere(false, p, p, nodes, statuses, nil)
		b.ReportAllocs()
		for b.Loop() {
			s := statuses["n0007"]
			s.Replicas, s.Version.Wall = slices.Clone(s.Replicas), s.Version.Wall+1
			statuses["n0007"] = s
			if got := x.Elsewhere(false, p, p, nodes, statuses, nil); got != nil {
				b.Fatalf("%d away, want none", len(got))
			}
		}
	})
}

// awayElsewhere is view.AwayIndex.Elsewhere without an index: every record is
// read.
func awayElsewhere(p, without placement.Placement, eligible []placement.Node, statuses map[string]view.NodeStatus) []placement.Holder {
	var x view.AwayIndex
	return x.Elsewhere(true, p, without, eligible, statuses, nil)
}

// A node back from a crash is held, until its first record of the new
// run arrives, with the record it published before it went down: its
// copies there, running since before the copies its peers started when
// it failed, died with it. They must not win the replicas back
// (placement.Keep keeps the oldest running copy first): at 300 nodes
// peers stopped 26 of the 30 replicas they had taken over, for the
// returning nodes to start them again.
func TestStaleRecordOfAReturningNodeHoldsNothingRunning(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	meta := func(started time.Time) []byte {
		return member.EncodeMeta(member.Meta{Since: t0.Add(-time.Hour).UnixNano(), Started: started.UnixNano()})
	}
	run1, run2 := t0.Add(100*time.Millisecond), t0.Add(time.Minute+300*time.Millisecond)
	members := []gossip.Member{
		{Name: "a", State: gossip.StateAlive, Meta: meta(run1)},
		{Name: "b", State: gossip.StateAlive, Meta: meta(run1)},
		{Name: "back", State: gossip.StateAlive, Meta: meta(run2)},
		{Name: "v1", State: gossip.StateAlive, Meta: binary.BigEndian.AppendUint64([]byte{member.MetaV1}, uint64(t0.UnixNano()))},
	}
	alive := map[string]bool{"a": true, "b": true, "back": true, "v1": true}
	// Records keep Started to the second (status.go).
	statuses := map[string]view.NodeStatus{
		"a":    {Started: run1.Truncate(time.Second)},
		"b":    {Started: run1.Truncate(time.Second)},
		"back": {Started: run1.Truncate(time.Second)},
		"v1":   {Started: t0},
	}
	if got := view.StaleRecords(members, alive, statuses, "a"); !got["back"] || len(got) != 1 {
		t.Fatalf("back with a new run, held with its record of the last one: want only it stale, got %v", got)
	}
	if got := view.StaleRecords(members, map[string]bool{"a": true, "b": true}, statuses, "a"); len(got) != 0 {
		t.Fatalf("not counted yet (flap damping): nothing to say of its record, got %v", got)
	}
	statuses["back"] = view.NodeStatus{Started: run2.Truncate(time.Second)}
	if got := view.StaleRecords(members, alive, statuses, "a"); len(got) != 0 {
		t.Fatalf("its record of the new run arrived: nothing stale, got %v", got)
	}
	// A record of a run later than the metadata held (a restart within
	// the failure detector's timeout, the alive message not here yet)
	// is not stale.
	members[2].Meta = meta(run1)
	if got := view.StaleRecords(members, alive, statuses, "a"); len(got) != 0 {
		t.Fatalf("a record newer than the metadata: nothing stale, got %v", got)
	}

	// Its stale copy of the replica that the node placement left free
	// took over loses to that node's.
	nodes := []placement.Node{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}
	ws := []placement.Workload{{Key: "default/web", Replicas: 3}}
	p := placement.Assign(nodes, ws, placement.Options{})
	ord, back := 0, p.Owner("default/web", 0)
	var other string
	for _, n := range nodes {
		if !slices.Contains(p.Owners["default/web"], n.Name) {
			other = n.Name
		}
	}
	if other == "" {
		t.Fatalf("want a node given none: %v", p.Owners)
	}
	statuses = map[string]view.NodeStatus{
		back:  {Replicas: []api.Replica{{Namespace: "default", Workload: "web", Ordinal: ord, Phase: api.PhaseRunning, Created: t0}}},
		other: {Replicas: []api.Replica{{Namespace: "default", Workload: "web", Ordinal: ord, Phase: api.PhaseRunning, Created: t0.Add(time.Minute)}}},
	}
	var x view.AwayIndex
	for _, tc := range []struct {
		stale map[string]bool
		want  string
	}{{nil, back}, {map[string]bool{back: true}, other}} {
		held := x.Elsewhere(false, p, p, nodes, statuses, tc.stale)
		if got := placement.Keep(p, nodes, ws, held, placement.Options{}).Owner("default/web", ord); got != tc.want {
			t.Errorf("stale %v: ordinal %d kept on %s, want %s (held %+v)", tc.stale, ord, got, tc.want, held)
		}
	}
}
