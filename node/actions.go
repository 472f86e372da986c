package node

import (
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

// actions is the bookkeeping of the reconcile loop's actions: the
// containers an action works on (busy), when actions finished (epochs,
// so no action rests on a list taken before an earlier action on its
// container finished), and failed actions with their retry backoff. Safe
// for concurrent use.
type actions struct {
	mu   sync.Mutex
	busy map[string]reconcile.ActionType // container IDs an action is working on
	// epoch counts finished actions; finished[id] is the epoch at which
	// the last action on container id finished, kept until every pass
	// that listed before it is over. An action is planned on a list of
	// containers; one that finished after that list was taken changed
	// what the list says, so a pass never acts on that container
	// (claim): a Start planned on "created, no task" after the create
	// that also started the task would kill the running task.
	epoch      uint64
	finished   map[string]uint64
	lastListed uint64             // the epoch of the last pass's list
	failures   map[string]failure // container IDs whose last action failed
}

func newActions() *actions {
	return &actions{busy: map[string]reconcile.ActionType{}, finished: map[string]uint64{}, failures: map[string]failure{}}
}

// finish marks act's containers free again, at a new epoch.
func (x *actions) finish(act reconcile.Action) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.epoch++
	for _, id := range act.IDs() {
		delete(x.busy, id)
		x.finished[id] = x.epoch
	}
}

// failure remembers a failed action so it is retried with backoff instead
// of in a hot loop, and so users see why a replica does not start. It is
// the one piece of memory reconcile uses, and only to slow retries down:
// a restarted agent simply retries at once.
type failure struct {
	count int
	until time.Time // no retry before
	err   string
}

// Failed actions are retried after 1 s doubling up to 5 min.
const (
	failureBackoffInitial = time.Second
	failureBackoffMax     = 5 * time.Minute
)

func (x *actions) recordFailure(act reconcile.Action, err error, now time.Time) failure {
	x.mu.Lock()
	defer x.mu.Unlock()
	var f failure
	for _, id := range act.IDs() {
		f = x.failures[id]
		f.count++
		wait := failureBackoffInitial << min(f.count-1, 20)
		if wait > failureBackoffMax {
			wait = failureBackoffMax
		}
		f.until, f.err = now.Add(wait), err.Error()
		x.failures[id] = f
	}
	return f
}

// pruneFailures forgets failures of containers that are neither desired
// here nor present: a deleted and re-applied Deployment starts afresh.
func (x *actions) pruneFailures(mine []reconcile.Replica, observed []reconcile.Container) {
	keep := map[string]bool{}
	for _, r := range mine {
		for _, id := range r.ContainerIDs() {
			keep[id] = true
		}
	}
	for _, c := range reconcile.Flatten(observed) {
		keep[c.ID] = true
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for id := range x.failures {
		if !keep[id] {
			delete(x.failures, id)
		}
	}
}

// resetFailures retries every failed action at once (an image arrived).
func (x *actions) resetFailures() {
	x.mu.Lock()
	defer x.mu.Unlock()
	for id, f := range x.failures {
		f.until = time.Time{}
		x.failures[id] = f
	}
}

func (x *actions) clearFailure(act reconcile.Action) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, id := range act.IDs() {
		delete(x.failures, id)
	}
}

// backoffs returns, by container ID, when an action on it may be tried
// again after a failure (reconcile.Decision.Backoff).
func (x *actions) backoffs() map[string]time.Time {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make(map[string]time.Time, len(x.failures))
	for id, f := range x.failures {
		out[id] = f.until
	}
	return out
}

// lastFailure returns the error of the last failed action on id, if any.
func (x *actions) lastFailure(id string) (string, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	f, ok := x.failures[id]
	return f.err, ok
}

// podFailure is the last failure of an action on one of the containers
// of replica r (its own first), or, r unknown (nil), of c and its
// members.
func (x *actions) podFailure(r *reconcile.Replica, c reconcile.Container) (string, bool) {
	ids := []string{c.ID}
	if r != nil {
		ids = r.ContainerIDs()
	}
	for _, m := range c.Members {
		ids = append(ids, m.ID)
	}
	for _, id := range ids {
		if msg, failed := x.lastFailure(id); failed {
			return msg, true
		}
	}
	return "", false
}

// listEpoch returns the epoch a pass's list of containers is taken at,
// and forgets finish marks no pass can be older than (the previous
// pass's list came before this one).
func (x *actions) listEpoch() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	for id, e := range x.finished {
		if e <= x.lastListed {
			delete(x.finished, id)
		}
	}
	x.lastListed = x.epoch
	return x.epoch
}

// stale reports whether an action on container id finished after the
// list of epoch listed was taken. Called with x.mu held.
func (x *actions) stale(id string, listed uint64) bool {
	return x.finished[id] > listed
}

// claim marks the action's containers busy; false if one already is, or
// if an action on one of them finished after the list the action was
// planned on (epoch listed): the next pass plans it again on a fresh
// list.
func (x *actions) claim(act reconcile.Action, listed uint64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, id := range act.IDs() {
		if _, ok := x.busy[id]; ok || x.stale(id, listed) {
			return false
		}
	}
	for _, id := range act.IDs() {
		x.busy[id] = act.Type
	}
	return true
}

// claimID marks one container ID busy, as claim does; release undoes it.
func (x *actions) claimID(id string, listed uint64) (release func(), ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, busy := x.busy[id]; busy || x.stale(id, listed) {
		return nil, false
	}
	x.busy[id] = reconcile.Remove
	return func() {
		x.mu.Lock()
		delete(x.busy, id)
		x.mu.Unlock()
	}, true
}

// creating reports whether a create (or replace) is in flight.
func (x *actions) creating() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, t := range x.busy {
		if t == reconcile.Create || t == reconcile.Replace {
			return true
		}
	}
	return false
}

func (x *actions) busyAction(id string) (reconcile.ActionType, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	t, ok := x.busy[id]
	return t, ok
}
