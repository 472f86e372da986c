package node

import (
	"sort"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

// A node that says it is ready but does not run what it is given (a
// hostile node with made-up capacity, or one whose runtime is stuck)
// would attract Deployment replicas that stay Pending forever. Every honest node
// lists in its status each replica it owns from the first reconcile pass
// that sees it (Pending, ContainerCreating, Running, ...). So each node
// watches, in its own view, whether every node lists the replicas
// placement gives it; a node that leaves one unlisted for longer than
// ackTimeout is taken out of placement for a while (ackTracker), doubling
// each time it happens again, like a crash-loop backoff. With the
// default ackTimeout (30 s) below the make-before-break HandoffTimeout
// (60 s), the old owner of a moved Deployment replica still runs it when
// the new owner is taken out, so no replica is lost to such a node.

// Defaults of the acknowledgement check.
const (
	defaultAckTimeout = 30 * time.Second
	maxExclusion      = 10 * time.Minute
	// strikeMemory is how long a node must go, after its last exclusion
	// ended, before its next one starts again from the shortest.
	strikeMemory = 10 * time.Minute
)

// unreported returns the nodes that own, by owner (replica ID -> node), a
// Deployment replica in all that their status in statuses does not list.
// StatefulSet replicas do not count: a fenced node stops listing them,
// rightly, and they never move off a live node (readView).
func unreported(all []reconcile.Replica, owner map[string]string, statuses map[string]NodeStatus) map[string]bool {
	listed := map[string]map[[2]string]bool{}
	for name, s := range statuses {
		l := make(map[[2]string]bool, len(s.Replicas))
		for _, r := range s.Replicas {
			l[[2]string{r.Namespace, r.Name}] = true
		}
		listed[name] = l
	}
	out := map[string]bool{}
	for _, r := range all {
		node := owner[r.ID]
		if r.AtMostOne || node == "" || out[node] {
			continue
		}
		if !listed[node][[2]string{r.Namespace, r.Name}] {
			out[node] = true
		}
	}
	return out
}

// ackTracker remembers, per node, since when it has left an assigned
// replica unlisted, and until when it is out of placement. Safe for
// concurrent use.
type ackTracker struct {
	timeout time.Duration
	mu      sync.Mutex
	since   map[string]time.Time // unlisted continuously since
	until   map[string]time.Time // out of placement until
	strikes map[string]int
	struck  map[string]time.Time // end of the last exclusion
}

func newAckTracker(timeout time.Duration) *ackTracker {
	return &ackTracker{timeout: timeout, since: map[string]time.Time{}, until: map[string]time.Time{},
		strikes: map[string]int{}, struck: map[string]time.Time{}}
}

// excluded returns the nodes out of placement at now.
func (t *ackTracker) excluded(now time.Time) map[string]bool {
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

// observe records which nodes leave an assigned replica unlisted at now
// and returns the ones it takes out of placement (sorted by name).
func (t *ackTracker) observe(now time.Time, unlisted map[string]bool) []exclusion {
	t.mu.Lock()
	defer t.mu.Unlock()
	for n := range t.since {
		if !unlisted[n] {
			delete(t.since, n)
		}
	}
	var out []exclusion
	for n := range unlisted {
		since, ok := t.since[n]
		if !ok {
			t.since[n] = now
			continue
		}
		if now.Sub(since) < t.timeout {
			continue
		}
		if now.Sub(t.struck[n]) > strikeMemory {
			t.strikes[n] = 0
		}
		d := t.timeout << min(t.strikes[n], 10)
		d = min(d, maxExclusion)
		t.strikes[n]++
		t.struck[n] = now.Add(d) // strikeMemory counts from the end of the exclusion
		t.until[n] = now.Add(d)
		delete(t.since, n)
		out = append(out, exclusion{n, d})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].node < out[j].node })
	return out
}
