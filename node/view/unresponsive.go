package view

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/placement"
)

// A node that says it is ready but does not run what it is given (a
// hostile node with made-up capacity, or one whose runtime is stuck)
// would attract Deployment replicas that stay Pending forever. Every honest node
// lists in its status each replica it owns from the first reconcile pass
// that sees it (Pending, ContainerCreating, Running, ...). So each node
// watches, in its own view, whether every node lists the replicas
// placement gives it; a node that lists none of them for longer than
// ackTimeout is taken out of placement for a while (AckTracker), doubling
// each time it happens again, like a crash-loop backoff. With the
// default ackTimeout (30 s) below the make-before-break HandoffTimeout
// (60 s), the old owner of a moved Deployment replica still runs it when
// the new owner is taken out, so no replica is lost to such a node.

// Defaults of the acknowledgement check.
const (
	maxExclusion = 10 * time.Minute
	// strikeMemory is how long a node must go, after its last exclusion
	// ended, before its next one starts again from the shortest.
	strikeMemory = 10 * time.Minute
)

// given is, for one placement, what unreported checks the records
// against: the placement (its owner of each slot: namespace, workload,
// ordinal), the workloads whose replicas do not count (those of StatefulSets) and
// the nodes that own a Deployment replica. It is built once per placement
// (givenSlots), not on every view, and holds no per-replica index: one
// cost 1 MB a view at 10,000 replicas.
type given struct {
	p        placement.Placement
	stateful map[string]bool // by WorkloadKey
	nodes    map[string]bool
}

// givenSlots is what p gives the nodes of the Deployment replicas of all.
// StatefulSet replicas do not count (see unreported).
func givenSlots(all []DesiredReplica, p placement.Placement) given {
	g := given{p: p, stateful: map[string]bool{}, nodes: map[string]bool{}}
	var last *reconcile.Replica
	for _, d := range all {
		if d.tmpl.AtMostOne && d.tmpl != last {
			g.stateful[d.key()] = true
			last = d.tmpl
		}
	}
	for key, owners := range p.Owners {
		if g.stateful[key] {
			continue
		}
		for _, n := range owners {
			if n != "" {
				g.nodes[n] = true
			}
		}
	}
	return g
}

// unreported returns the nodes that own Deployment replicas (g) while
// their status in statuses lists a replica of none of those slots
// (namespace, workload, ordinal). None,
// not one: an honest node whose view lags or differs (a Deployment it
// has not received yet, membership it sees otherwise, exclusions of its
// own that move a replica elsewhere) still lists most of what it is
// given, while a node that runs nothing lists none of it. A slot, not a
// name: during a rolling update the replica of the new spec is held back
// while the old one still runs, and the node rightly lists the old one.
// StatefulSet replicas do not count: a fenced node stops listing them,
// rightly, and they never move off a live node (placement.Keep). It reads each
// owner's record up to its first listed slot: O(nodes) on a cluster that
// agrees, where building every record's slots cost O(replicas) in
// allocations on every view.
func unreported(g given, statuses map[string]NodeStatus) map[string]bool {
	out := map[string]bool{}
	for node := range g.nodes {
		if !slices.ContainsFunc(statuses[node].Replicas, func(r api.Replica) bool {
			key := reconcile.WorkloadKey(r.Namespace, r.Workload)
			return !g.stateful[key] && g.p.Owner(key, r.Ordinal) == node
		}) {
			out[node] = true
		}
	}
	return out
}

// AckTracker remembers, per node, since when it has left an assigned
// replica unlisted, and until when it is out of placement. Safe for
// concurrent use.
type AckTracker struct {
	timeout time.Duration
	mu      sync.Mutex
	since   map[string]time.Time // unlisted continuously since
	until   map[string]time.Time // out of placement until
	strikes map[string]int
	struck  map[string]time.Time // end of the last exclusion
}

func NewAckTracker(timeout time.Duration) *AckTracker {
	return &AckTracker{timeout: timeout, since: map[string]time.Time{}, until: map[string]time.Time{},
		strikes: map[string]int{}, struck: map[string]time.Time{}}
}

// excluded returns the nodes out of placement at now.
func (t *AckTracker) excluded(now time.Time) map[string]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]bool{}
	for n, u := range t.until {
		if now.Before(u) {
			out[n] = true
		} else {
			delete(t.until, n)
		}
	}
	return out
}

// exclusion is one node taken out of placement.
type exclusion struct {
	node string
	for_ time.Duration
}

// due reports whether a node has been unlisted for the timeout at now:
// observe would take it out of placement.
func (t *AckTracker) due(now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, since := range t.since {
		if now.Sub(since) >= t.timeout {
			return true
		}
	}
	return false
}

// observe records which nodes leave an assigned replica unlisted at now
// and returns the ones it takes out of placement (sorted by name). At
// most limit nodes are out at once: when more look unresponsive, the
// judgement, not the cluster, is likely wrong (a stalled rollout, a slow
// store), and leaving most nodes out would stop what they run.
func (t *AckTracker) observe(now time.Time, unlisted map[string]bool, limit int) []exclusion {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := 0
	for _, u := range t.until {
		if now.Before(u) {
			out++
		}
	}
	for n := range t.since {
		if !unlisted[n] {
			delete(t.since, n)
		}
	}
	var res []exclusion
	for _, n := range slices.Sorted(maps.Keys(unlisted)) {
		since, ok := t.since[n]
		if !ok {
			t.since[n] = now
			continue
		}
		if now.Sub(since) < t.timeout || out >= limit {
			continue
		}
		out++
		if now.Sub(t.struck[n]) > strikeMemory {
			t.strikes[n] = 0
		}
		d := t.timeout << min(t.strikes[n], 10)
		d = min(d, maxExclusion)
		t.strikes[n]++
		t.struck[n] = now.Add(d) // strikeMemory counts from the end of the exclusion
		t.until[n] = now.Add(d)
		delete(t.since, n)
		res = append(res, exclusion{n, d})
	}
	return res
}
