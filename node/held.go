package node

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/placement"
)

// heldIndex keeps, per eligible node, the copies its record lists of
// replicas that placement gives another node, for heldElsewhere: a
// derive reads again only the records that changed since (by the
// identity of their decoded replica list) or all of them after placement
// changed (gen). Owned by the view builder.
type heldIndex struct {
	gen   uint64 // placement's generation the entries were read against
	nodes map[string]heldEntry
}

type heldEntry struct {
	replicas []api.Replica // the list read (compared by identity)
	away     []placement.Holder
}

// holds reports whether r is a copy that counts: a container that is not
// being stopped (not Terminating, Pending or CreateBackOff).
func holds(r api.Replica) bool {
	switch r.Phase {
	case api.PhaseTerminating, api.PhasePending, api.PhaseCreateBackOff:
		return false
	}
	return true
}

// elsewhere lists, for each replica that an eligible node runs while
// placement (p, or without: see place; both of generation gen) gives it
// to another node, every copy of it the eligible nodes hold (holds),
// with when it was created: what placement.Keep leaves where it runs.
// Sorted by workload key, ordinal, node; nil when there are none. It
// costs O(eligible nodes + replicas of the records that changed).
func (x *heldIndex) elsewhere(gen uint64, p, without placement.Placement, eligible []placement.Node, statuses map[string]NodeStatus) []placement.Holder {
	if x.nodes == nil || x.gen != gen {
		x.nodes, x.gen = map[string]heldEntry{}, gen
	}
	type slot struct {
		key     string
		ordinal int
	}
	var out []placement.Holder
	away := map[slot]bool{}
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
		rs := statuses[n.Name].Replicas
		e, ok := x.nodes[n.Name]
		if !ok || len(e.replicas) != len(rs) || len(rs) > 0 && &e.replicas[0] != &rs[0] {
			e = heldEntry{replicas: rs}
			for _, r := range rs {
				key := keyOf(r)
				if holds(r) && (p.Owner(key, r.Ordinal) != n.Name || without.Owner(key, r.Ordinal) != n.Name) {
					e.away = append(e.away, placement.Holder{Key: key, Ordinal: r.Ordinal, Node: n.Name, Since: r.Created})
				}
			}
			x.nodes[n.Name] = e
		}
		for _, h := range e.away {
			away[slot{h.Key, h.Ordinal}] = true
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
	// The owners' own copies of those replicas.
	for s := range away {
		for _, o := range []string{p.Owner(s.key, s.ordinal), without.Owner(s.key, s.ordinal)} {
			if !live[o] || slices.ContainsFunc(out, func(h placement.Holder) bool { return h.Node == o && h.Key == s.key && h.Ordinal == s.ordinal }) {
				continue
			}
			for _, r := range statuses[o].Replicas {
				if holds(r) && r.Ordinal == s.ordinal && keyOf(r) == s.key {
					out = append(out, placement.Holder{Key: s.key, Ordinal: s.ordinal, Node: o, Since: r.Created})
					break
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b placement.Holder) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), cmp.Compare(a.Ordinal, b.Ordinal), strings.Compare(a.Node, b.Node), a.Since.Compare(b.Since))
	})
	return out
}

// heldElsewhere is heldIndex.elsewhere without an index: every record is
// read.
func heldElsewhere(p, without placement.Placement, eligible []placement.Node, statuses map[string]NodeStatus) []placement.Holder {
	var x heldIndex
	return x.elsewhere(0, p, without, eligible, statuses)
}

// holdersKey identifies a heldElsewhere list: equal keys, equal lists.
func holdersKey(hs []placement.Holder) string {
	var b []byte
	for _, h := range hs {
		b = strconv.AppendQuote(b, h.Key)
		b = strconv.AppendInt(b, int64(h.Ordinal), 10)
		b = strconv.AppendQuote(b, h.Node)
		b = strconv.AppendInt(b, h.Since.UnixNano(), 10)
		b = append(b, ';')
	}
	return string(b)
}
