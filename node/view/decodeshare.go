package view

import (
	"sync"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// DecodeShare lets the agents of one process share what they decode
// from identical records, as the stores of a simulation share their
// bytes (store.Pool): the scale simulation's agents all hold the same
// desired objects and node records, and at 1,000 nodes of 10 replicas
// each, every agent's own copy of the 10,000 desired replicas (about
// 500 bytes each) and of 1,000 decoded node records came to about 10 GB.
// A real agent has none (Config.shareDecodes is nil): it is alone in its
// process. Shared values are read only, as everything in a view is.
type DecodeShare struct {
	mu sync.Mutex
	// statuses holds, by record key, the newest version decoded by any
	// agent: an agent holding an older one decodes it itself.
	statuses map[string]cachedStatus
	// objects holds, by record key, the newest version of each desired
	// object decoded (and expanded: AllReplicas) by any agent.
	objects map[string]cachedObject
	// replicas holds the desired replicas (AllReplicas) of the last
	// few sets of workload records, by recordsKey.
	replicas     map[string][]DesiredReplica
	replicaOrder []string
}

// sharedReplicaSets is how many sets of desired replicas DecodeShare
// keeps: agents converge on the same workload records, but while 100
// Deployments are applied one by one they hold many different sets (at
// 1,000 agents with 8 kept, their own copies still came to 2.4 GB).
const sharedReplicaSets = 64

func NewDecodeShare() *DecodeShare {
	return &DecodeShare{statuses: map[string]cachedStatus{}, objects: map[string]cachedObject{}, replicas: map[string][]DesiredReplica{}}
}

// status returns the shared decoding of r, if an agent decoded it (never
// on a nil s).
func (s *DecodeShare) status(r crdt.Record) (cachedStatus, bool) {
	if s == nil {
		return cachedStatus{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.statuses[r.Key]
	return c, ok && c.from.same(r)
}

// putStatus shares c, decoded from r, unless a newer version of r's key
// is shared. A nil s shares nothing.
func (s *DecodeShare) putStatus(r crdt.Record, c cachedStatus) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.statuses[r.Key]; ok && old.from.version.Compare(r.Version) > 0 {
		return
	}
	s.statuses[r.Key] = c
}

// object returns the shared decoding of r, if an agent decoded it (never
// on a nil s).
func (s *DecodeShare) object(r crdt.Record) (cachedObject, bool) {
	if s == nil {
		return cachedObject{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.objects[r.Key]
	return c, ok && c.from.same(r)
}

// putObject shares c, decoded from r, unless a newer version of r's key
// is shared, or the same version already expanded. A nil s shares
// nothing.
func (s *DecodeShare) putObject(r crdt.Record, c cachedObject) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.objects[r.Key]; ok && (old.from.version.Compare(r.Version) > 0 || old.from.same(r) && old.expanded && !c.expanded) {
		return
	}
	s.objects[r.Key] = c
}

// replicaSet returns the shared desired replicas of the workload records
// identified by key (recordsKey), computing and sharing them with
// compute when no agent has.
func (s *DecodeShare) replicaSet(key string, compute func() []DesiredReplica) []DesiredReplica {
	s.mu.Lock()
	rs, ok := s.replicas[key]
	s.mu.Unlock()
	if ok {
		return rs
	}
	rs = compute()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.replicas[key]; !ok {
		s.replicas[key] = rs
		s.replicaOrder = append(s.replicaOrder, key)
		if len(s.replicaOrder) > sharedReplicaSets {
			delete(s.replicas, s.replicaOrder[0])
			s.replicaOrder = s.replicaOrder[1:]
		}
	}
	return rs
}
