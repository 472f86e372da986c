package view

import (
	"cmp"
	"slices"
	"strings"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/placement"
)

// AwayIndex keeps, per eligible node, the copies its record lists of
// replicas that placement gives another node, for Elsewhere: a
// derive reads again only the records that changed since (by their
// version, NodeStatus.Version; a status of version zero, which no record
// carries, is read each time) or all of them after placement was
// computed anew. Owned by the view builder.
type AwayIndex struct {
	nodes map[string]*awayEntry
}

type awayEntry struct {
	node     string
	replicas []api.Replica // the list read
	version  hlc.Timestamp // of the record it was read from
	stale    bool          // read as a record an earlier run of the node wrote
	away     []placement.Holder
	// copies indexes the node's copy of each replica it holds, built
	// on first use (copyOf) of a long list: only the owners of replicas
	// that run away are asked.
	copies map[awaySlot]placement.Holder
}

// scanCopies is the longest replica list copyOf reads through rather
// than indexes: a node runs about 10 replicas, and an index a node cost
// 1 MB a view at 1,000 simulated nodes applying their workloads.
const scanCopies = 32

type awaySlot struct {
	key     string
	ordinal int
}

// holds reports whether r is a copy that counts: not being stopped
// (Terminating) and not failing to be created (api.PhaseCreateBackOff,
// api.PhaseConfigError). A Pending
// copy counts (not running, age unknown): a Replace lists its old copy
// Terminating and its new one Pending, and the replica must not leave
// the node for it.
func holds(r api.Replica) bool {
	return r.Phase != api.PhaseTerminating && r.Phase != api.PhaseCreateBackOff && r.Phase != api.PhaseConfigError
}

// holderOf is the Holder of node's copy r of the replica of key. A copy
// listed in a stale record (one an earlier run of the node's agent wrote:
// back from a crash, the copy died with it; see StaleRecords) is taken as
// not running, of unknown age: any other copy that runs is kept first,
// and with none the node keeps it (an agent restart, its pods running).
func holderOf(key, node string, r api.Replica, stale bool) placement.Holder {
	if stale {
		return placement.Holder{Key: key, Ordinal: r.Ordinal, Node: node}
	}
	return placement.Holder{Key: key, Ordinal: r.Ordinal, Node: node, Since: r.Created, Running: r.Phase == api.PhaseRunning}
}

// Elsewhere lists, for each replica that an eligible node runs while
// placement (p, or without: see place; computed anew since the last call
// when placed) gives it
// to another node, every copy of it the eligible nodes hold (holds),
// with when it was created: what placement.Keep leaves where it runs.
// The records of the nodes in stale are of an earlier run of their
// agent (holderOf). Sorted by workload key, ordinal, node; nil
// when there are none. It costs O(eligible nodes + replicas of the
// records that changed).
func (x *AwayIndex) Elsewhere(placed bool, p, without placement.Placement, eligible []placement.Node, statuses map[string]NodeStatus, stale map[string]bool) []placement.Holder {
	if x.nodes == nil || placed {
		x.nodes = map[string]*awayEntry{}
	}
	var out []placement.Holder
	away := map[awaySlot]bool{}
	keys := map[[2]string]string{} // (namespace, workload) -> WorkloadKey, built once each
	keyOf := func(r api.Replica) string {
		k, ok := keys[[2]string{r.Namespace, r.Workload}]
		if !ok {
			k = reconcile.WorkloadKey(r.Namespace, r.Workload)
			keys[[2]string{r.Namespace, r.Workload}] = k
		}
		return k
	}
	live := make(map[string]bool, len(eligible))
	for _, n := range eligible {
		live[n.Name] = true
		st := statuses[n.Name]
		rs := st.Replicas
		e, ok := x.nodes[n.Name]
		if !ok || e.stale != stale[n.Name] || e.version != st.Version || st.Version.IsZero() {
			e = &awayEntry{node: n.Name, replicas: rs, version: st.Version, stale: stale[n.Name]}
			for _, r := range rs {
				if !holds(r) {
					continue
				}
				key := keyOf(r)
				if p.Owner(key, r.Ordinal) != n.Name || without.Owner(key, r.Ordinal) != n.Name {
					e.away = append(e.away, holderOf(key, n.Name, r, e.stale))
				}
			}
			x.nodes[n.Name] = e
		}
		for _, h := range e.away {
			away[awaySlot{h.Key, h.Ordinal}] = true
			out = append(out, h)
		}
	}
	for name := range x.nodes {
		if !live[name] {
			delete(x.nodes, name)
		}
	}
	if len(out) == 0 {
		return nil
	}
	// The owners' own copies of those replicas (an owner's copy is never
	// in its own away list: p and without both give it the replica, or
	// the copy is away).
	for s := range away {
		o, ow := p.Owner(s.key, s.ordinal), without.Owner(s.key, s.ordinal)
		if o != ow {
			continue // a copy on either is away, and listed
		}
		if e, ok := x.nodes[o]; ok && live[o] {
			if h, ok := e.copyOf(s, keyOf); ok {
				out = append(out, h)
			}
		}
	}
	slices.SortFunc(out, func(a, b placement.Holder) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), cmp.Compare(a.Ordinal, b.Ordinal), strings.Compare(a.Node, b.Node), a.Since.Compare(b.Since))
	})
	return out
}

// copyOf is e's node's copy of the replica of slot s, of those that
// count (holds): of a surge's two copies, the running one. A short list
// is read through; a long one is indexed on first use.
func (e *awayEntry) copyOf(s awaySlot, keyOf func(api.Replica) string) (placement.Holder, bool) {
	if len(e.replicas) <= scanCopies {
		var h placement.Holder
		found := false
		for _, r := range e.replicas {
			if r.Ordinal != s.ordinal || !holds(r) || keyOf(r) != s.key {
				continue
			}
			if c := holderOf(s.key, e.node, r, e.stale); !found || c.Running && !h.Running {
				h, found = c, true
			}
		}
		return h, found
	}
	if e.copies == nil {
		e.copies = make(map[awaySlot]placement.Holder, len(e.replicas))
		for _, r := range e.replicas {
			if !holds(r) {
				continue
			}
			key := keyOf(r)
			h := holderOf(key, e.node, r, e.stale)
			s := awaySlot{key, r.Ordinal}
			if old, dup := e.copies[s]; !dup || h.Running && !old.Running {
				e.copies[s] = h
			}
		}
	}
	h, ok := e.copies[s]
	return h, ok
}

// SameHolders reports whether a and b list the same copies.
func SameHolders(a, b []placement.Holder) bool {
	return slices.EqualFunc(a, b, func(x, y placement.Holder) bool {
		return x.Key == y.Key && x.Ordinal == y.Ordinal && x.Node == y.Node && x.Since.Equal(y.Since) && x.Running == y.Running
	})
}
