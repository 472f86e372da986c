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

// heldElsewhere lists, for each replica that an eligible node runs while
// placement (p, or without: see place) gives it to another node, every
// copy of it the eligible nodes report running (a container that is not
// being stopped: not Terminating, Pending or CreateBackOff), with
// when it was created: what placement.Keep leaves where it runs. Sorted
// by workload key, ordinal, node. O(replicas the eligible nodes list).
func heldElsewhere(p, without placement.Placement, eligible []placement.Node, statuses map[string]NodeStatus) []placement.Holder {
	type slot struct {
		key     string
		ordinal int
	}
	keys := map[[2]string]string{} // (namespace, workload) -> WorkloadKey, built once each
	var copies []placement.Holder
	away := map[slot]bool{}
	for _, n := range eligible {
		for _, r := range statuses[n.Name].Replicas {
			switch r.Phase {
			case api.PhaseTerminating, api.PhasePending, api.PhaseCreateBackOff:
				continue // being stopped, or no container yet
			}
			key, ok := keys[[2]string{r.Namespace, r.Workload}]
			if !ok {
				key = reconcile.WorkloadKey(r.Namespace, r.Workload)
				keys[[2]string{r.Namespace, r.Workload}] = key
			}
			copies = append(copies, placement.Holder{Key: key, Ordinal: r.Ordinal, Node: n.Name, Since: r.Created})
			if p.Owner(key, r.Ordinal) != n.Name || without.Owner(key, r.Ordinal) != n.Name {
				away[slot{key, r.Ordinal}] = true
			}
		}
	}
	if len(away) == 0 {
		return nil
	}
	out := slices.DeleteFunc(copies, func(h placement.Holder) bool { return !away[slot{h.Key, h.Ordinal}] })
	slices.SortFunc(out, func(a, b placement.Holder) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), cmp.Compare(a.Ordinal, b.Ordinal), strings.Compare(a.Node, b.Node), a.Since.Compare(b.Since))
	})
	return out
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
