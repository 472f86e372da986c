package node

import (
	"cmp"
	"reflect"
	"slices"
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
	// given lists, by node, the replicas p and without place on it
	// (read once per generation; givenWithout nil when without is p).
	given, givenWithout map[string][]placement.Slot
}

type heldEntry struct {
	replicas []api.Replica // the list read (compared by identity)
	away     []placement.Holder
	copies   map[heldSlot]placement.Holder // the node's copy of each replica it holds
	// missing and missingWithout are the replicas p and without place
	// on the node that it does not hold.
	missing, missingWithout []placement.Slot
}

// keepInputs is what placement.Keep is given besides placement: the
// copies held away from placement's choice (with the owners' copies of
// the same replicas), and the replicas placed where they are not held,
// for p and for without.
type keepInputs struct {
	held                  []placement.Holder
	unheld, unheldWithout []placement.Slot
}

// same reports whether k and o give Keep the same inputs (without held
// copies, the unheld do not matter: Keep returns placement as it is).
func (k keepInputs) same(o keepInputs) bool {
	return sameHolders(k.held, o.held) && (len(k.held) == 0 || slices.Equal(k.unheld, o.unheld) && slices.Equal(k.unheldWithout, o.unheldWithout))
}

// slotsByNode lists, by node, the replicas p places on it.
func slotsByNode(p placement.Placement) map[string][]placement.Slot {
	out := map[string][]placement.Slot{}
	for key, owners := range p.Owners {
		for ord, o := range owners {
			if o != "" {
				out[o] = append(out[o], placement.Slot{Key: key, Ordinal: ord})
			}
		}
	}
	return out
}

// missingFrom is the slots of given that copies lacks.
func missingFrom(given []placement.Slot, copies map[heldSlot]placement.Holder) []placement.Slot {
	var out []placement.Slot
	for _, sl := range given {
		if _, ok := copies[heldSlot{sl.Key, sl.Ordinal}]; !ok {
			out = append(out, sl)
		}
	}
	return out
}

// compareSlots orders slots by workload key, then ordinal.
func compareSlots(a, b placement.Slot) int {
	return cmp.Or(strings.Compare(a.Key, b.Key), cmp.Compare(a.Ordinal, b.Ordinal))
}

type heldSlot struct {
	key     string
	ordinal int
}

// holds reports whether r is a copy that counts: not being stopped
// (Terminating) and not failing to be created (CreateBackOff). A Pending
// copy counts (not running, age unknown): a Replace lists its old copy
// Terminating and its new one Pending, and the replica must not leave
// the node for it.
func holds(r api.Replica) bool {
	return r.Phase != api.PhaseTerminating && r.Phase != api.PhaseCreateBackOff
}

// holderOf is the Holder of node's copy r of the replica of key.
func holderOf(key, node string, r api.Replica) placement.Holder {
	return placement.Holder{Key: key, Ordinal: r.Ordinal, Node: node, Since: r.Created, Running: r.Phase == api.PhaseRunning}
}

// elsewhere lists, for each replica that an eligible node runs while
// placement (p, or without: see place; both of generation gen) gives it
// to another node, every copy of it the eligible nodes hold (holds),
// with when it was created: what placement.Keep leaves where it runs.
// Sorted by workload key, ordinal, node; nil when there are none. See
// inputs for the replicas placed where they are not held.
func (x *heldIndex) elsewhere(gen uint64, p, without placement.Placement, eligible []placement.Node, statuses map[string]NodeStatus) []placement.Holder {
	return x.inputs(gen, p, without, eligible, statuses).held
}

// inputs is elsewhere's held copies, with the replicas p and without
// place on an eligible node that does not hold them (sorted by key and
// ordinal): those placement.Keep places around what runs. It costs
// O(eligible nodes + replicas of the records that changed + unheld),
// and O(replicas) when placement changed.
func (x *heldIndex) inputs(gen uint64, p, without placement.Placement, eligible []placement.Node, statuses map[string]NodeStatus) keepInputs {
	if x.nodes == nil || x.gen != gen {
		x.nodes, x.gen = map[string]heldEntry{}, gen
		x.given, x.givenWithout = slotsByNode(p), nil
		if reflect.ValueOf(without.Owners).UnsafePointer() != reflect.ValueOf(p.Owners).UnsafePointer() {
			x.givenWithout = slotsByNode(without)
		}
	}
	var in keepInputs
	var out []placement.Holder
	away := map[heldSlot]bool{}
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
			e = heldEntry{replicas: rs, copies: make(map[heldSlot]placement.Holder, len(rs))}
			for _, r := range rs {
				if !holds(r) {
					continue
				}
				key := keyOf(r)
				h := holderOf(key, n.Name, r)
				s := heldSlot{key, r.Ordinal}
				if old, dup := e.copies[s]; !dup || h.Running && !old.Running {
					e.copies[s] = h // a surge's two copies: the running one
				}
				if p.Owner(key, r.Ordinal) != n.Name || without.Owner(key, r.Ordinal) != n.Name {
					e.away = append(e.away, h)
				}
			}
			e.missing = missingFrom(x.given[n.Name], e.copies)
			e.missingWithout = e.missing
			if x.givenWithout != nil {
				e.missingWithout = missingFrom(x.givenWithout[n.Name], e.copies)
			}
			x.nodes[n.Name] = e
		}
		for _, h := range e.away {
			away[heldSlot{h.Key, h.Ordinal}] = true
			out = append(out, h)
		}
	}
	for name := range x.nodes {
		if !live[name] {
			delete(x.nodes, name)
		}
	}
	if len(out) == 0 {
		return in // nothing away: Keep does not read unheld
	}
	for _, n := range eligible {
		e := x.nodes[n.Name]
		in.unheld = append(in.unheld, e.missing...)
		in.unheldWithout = append(in.unheldWithout, e.missingWithout...)
	}
	slices.SortFunc(in.unheld, compareSlots)
	slices.SortFunc(in.unheldWithout, compareSlots)
	// The owners' own copies of those replicas (an owner's copy is never
	// in its own away list: p and without both give it the replica, or
	// the copy is away).
	for s := range away {
		o, ow := p.Owner(s.key, s.ordinal), without.Owner(s.key, s.ordinal)
		if o != ow {
			continue // a copy on either is away, and listed
		}
		if h, ok := x.nodes[o].copies[s]; ok && live[o] {
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(a, b placement.Holder) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), cmp.Compare(a.Ordinal, b.Ordinal), strings.Compare(a.Node, b.Node), a.Since.Compare(b.Since))
	})
	in.held = out
	return in
}

// sameHolders reports whether a and b list the same copies.
func sameHolders(a, b []placement.Holder) bool {
	return slices.EqualFunc(a, b, func(x, y placement.Holder) bool {
		return x.Key == y.Key && x.Ordinal == y.Ordinal && x.Node == y.Node && x.Since.Equal(y.Since) && x.Running == y.Running
	})
}
