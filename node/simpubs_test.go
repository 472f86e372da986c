package node

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/view"
)

// simPubs classifies the node records the simulation's agents publish by
// what changed in their replica lists since each node's last
// publication, to show which replica transitions a return pays for.
type simPubs struct {
	mu     sync.Mutex
	last   map[string]map[string]api.Replica // node -> replica name -> replica
	shapes map[string]int                    // shape -> publications
}

func newSimPubs() *simPubs {
	return &simPubs{last: map[string]map[string]api.Replica{}, shapes: map[string]int{}}
}

// observe notes the records node is about to publish.
// publishedStore is a node's store that shows simPubs the node's own
// status records as they are written: each one it publishes.
type publishedStore struct {
	Store
	node string
	pubs *simPubs
}

func (s *publishedStore) Apply(r crdt.Record) (bool, error) {
	changed, err := s.Store.Apply(r)
	if changed && r.Origin == s.node {
		s.pubs.observe(s.node, []crdt.Record{r})
	}
	return changed, err
}

func (p *simPubs) observe(node string, recs []crdt.Record) {
	for _, rec := range recs {
		if rec.Key != view.StatusKey(node) || rec.Deleted {
			continue
		}
		var st view.NodeStatus
		if json.Unmarshal(rec.Value, &st) != nil {
			continue
		}
		now := make(map[string]api.Replica, len(st.Replicas))
		for _, r := range st.Replicas {
			now[r.Name] = r
		}
		p.mu.Lock()
		p.shapes[pubShape(p.last[node], now)]++
		p.last[node] = now
		p.mu.Unlock()
	}
}

// pubShape names what changed from before to now: new replicas (ready or
// not), replicas that turned ready, turned unready, began terminating or
// went away, and other changes (restarts, reasons, times); kinds sorted,
// joined by "+"; "node" when no replica changed.
func pubShape(before, now map[string]api.Replica) string {
	kinds := map[string]bool{}
	for name, r := range now {
		b, ok := before[name]
		switch {
		case !ok && r.Available():
			kinds["new ready"] = true
		case !ok:
			kinds["new "+string(r.Phase)] = true
		case r.Phase == api.PhaseTerminating && b.Phase != api.PhaseTerminating:
			kinds["terminating"] = true
		case r.Available() && !b.Available():
			kinds["ready"] = true
		case !r.Available() && b.Available():
			kinds["unready"] = true
		case r.Phase != b.Phase:
			kinds[string(b.Phase)+">"+string(r.Phase)] = true
		case fmt.Sprint(r) != fmt.Sprint(b):
			kinds["other"] = true
		}
	}
	for name := range before {
		if _, ok := now[name]; !ok {
			kinds["gone"] = true
		}
	}
	if len(kinds) == 0 {
		return "node"
	}
	return strings.Join(slices.Sorted(maps.Keys(kinds)), "+")
}

// since returns the publications by shape since the counts in before,
// most frequent first ("shape n, ...").
func (p *simPubs) since(before map[string]int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	type row struct {
		shape string
		n     int
	}
	var rows []row
	for s, n := range p.shapes {
		if d := n - before[s]; d > 0 {
			rows = append(rows, row{s, d})
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		return rows[i].n > rows[j].n || rows[i].n == rows[j].n && rows[i].shape < rows[j].shape
	})
	parts := make([]string, len(rows))
	for i, r := range rows {
		parts[i] = fmt.Sprintf("%s %d", r.shape, r.n)
	}
	return strings.Join(parts, ", ")
}

// counts returns a copy of the counts by shape.
func (p *simPubs) counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.shapes)
}
