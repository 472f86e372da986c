package reconcile

import (
	"sort"
	"time"
)

// DefaultHandoffTimeout bounds make-before-break: an old owner keeps its
// copy at most this long while the new owner brings its own up.
const DefaultHandoffTimeout = 60 * time.Second

// Ownership is the input of Owned.
type Ownership struct {
	// Self is this node's name.
	Self string
	// All are the desired replicas of the whole cluster.
	All []Replica
	// Owner returns the node placement gives the replica of an ID (""
	// when it fits nowhere or is not desired).
	Owner func(id string) string
	// Observed are the containers on this node.
	Observed []Container
	// ReadyElsewhere holds the IDs of replicas that their owner (another
	// node) reports running and ready.
	ReadyElsewhere map[string]bool
	// HandoffSince holds, for replicas this node is handing off, when it
	// first saw that another node owns them (the result of the last call).
	HandoffSince map[string]time.Time
	Now          time.Time
	Timeout      time.Duration
}

// Owned returns the replicas this node must run and the handoffs still in
// progress (feed them back as HandoffSince next time).
//
// A node runs what placement gives it. Handoff is make-before-break: a
// replica this node already runs but that placement now gives to another
// (live) node stays until the new owner reports its copy ready, or until
// Timeout has passed since this node first saw the move. A replica whose
// owner died needs no handoff: placement only picks live nodes, so the new
// owner starts it at once.
func Owned(in Ownership) (mine []Replica, handoffs map[string]time.Time) {
	handoffs = map[string]time.Time{}
	running := map[string]bool{}
	for _, c := range in.Observed {
		if c.State == StateRunning {
			running[c.ID] = true
		}
	}
	for _, r := range in.All {
		owner := in.Owner(r.ID)
		if owner == in.Self {
			mine = append(mine, r)
			continue
		}
		// At-most-one replicas are never handed off make-before-break: the
		// old owner lets go at once and the new one waits for that.
		if owner == "" || r.AtMostOne || !running[r.ID] || in.ReadyElsewhere[r.ID] {
			continue
		}
		since, ok := in.HandoffSince[r.ID]
		if !ok {
			since = in.Now
		}
		if in.Now.Sub(since) < in.Timeout {
			mine = append(mine, r)
			handoffs[r.ID] = since
		}
	}
	sort.Slice(mine, func(i, j int) bool { return mine[i].ID < mine[j].ID })
	return mine, handoffs
}
