package node

import "time"

// The fence's side of the lease (watchdog.go): whether a renewal is due,
// and noticing a lease that ran out while it was.

// forLease is what a lease renewal at now needs: whether this node holds
// the quorum (after looking for a lapsed lease, checkLeaseLapse).
func (q *fence) forLease(now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.checkLeaseLapse(now)
	return q.has
}

// leased records the deadline of the lease just written.
func (q *fence) leased(deadline time.Time) {
	q.mu.Lock()
	q.leaseDeadline = deadline
	q.mu.Unlock()
}

// checkLeaseLapse notes this node as back (noteBack) when its last fence
// lease ran out while it held the quorum (so a renewal was due): the agent was stopped or starved
// that long, its watchdog may have killed its StatefulSet replicas and
// its peers may have started them. Whoever looks first after such a gap
// (a reconcile, or the renewal) sees it, before anything is started on a
// view from before the gap. Called with q.mu held.
func (q *fence) checkLeaseLapse(now time.Time) {
	if !q.leaseDeadline.IsZero() && now.After(q.leaseDeadline) {
		q.leaseDeadline = time.Time{}
		if !q.has {
			return // fenced: no renewal was due; regaining the quorum settles
		}
		q.noteBack(now)
		q.log.Warn("this node's fence lease ran out before it was renewed (the agent was stopped or starved): StatefulSet replicas start again only after --rejoin-settle")
	}
}
