package node

import (
	"maps"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/view"
)

// Flap damping: which members count as alive for placement (members).

// AliveAfter returns the names of the members of list (the membership)
// that count for placement at now: alive or suspect ("suspect" alone
// moves nothing), the local node unless it settles itself (selfUntil,
// see askSettle). prev (nil: none) is the last
// answer: it returns prev's set itself when it is equal (the view keeps
// it), and reports whether it is.
//
// Flap damping: a member this node saw dead or left, and that is back,
// counts only once it has stayed back for --rejoin-settle. A node that
// was declared dead falsely (a busy CPU, a flaky link) then does not pull
// its replicas back and forth; failover itself is never delayed.
//
// When list is the
// snapshot prev was computed from and the flap damping neither changed
// since nor waits for a member to settle, the answer is prev's without a
// walk: the view looks every second, and walking 1,000 members for
// nothing was 5 % of the CPU of a simulated 1,000-node cluster.
func (m *members) AliveAfter(now time.Time, list []gossip.Member, prev *view.Alive) (view.Alive, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if prev != nil && prev.Gen == m.gen && len(m.memberBack) == 0 && m.selfUntil.IsZero() && sameSnapshot(prev.From, list) {
		return *prev, true
	}
	set := map[string]bool{}
	if !m.selfUntil.IsZero() && !now.Before(m.selfUntil) {
		m.selfUntil = time.Time{}
		m.gen++
		m.log.Info("this node counts itself for placement again, as its peers do")
	}
	if m.selfUntil.IsZero() {
		set[m.self] = true
	}
	m.walkAliveLocked(now, list, func(name string) { set[name] = true })
	if prev != nil && maps.Equal(set, prev.Set) {
		return view.Alive{Set: prev.Set, From: list, Gen: m.gen}, true
	}
	return view.Alive{Set: set, From: list, Gen: m.gen}, false
}

// sameSnapshot reports whether a and b are one membership snapshot
// (gossip.Cluster.Members shares one until membership changes).
func sameSnapshot(a, b []gossip.Member) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// walkAliveLocked calls f with every member of list that counts as alive
// at now (see aliveAfter), recording the members' going down and coming back
// (each change counts in gen). Called with mu held.
func (m *members) walkAliveLocked(now time.Time, list []gossip.Member, f func(name string)) {
	for _, mem := range list {
		if mem.Name == m.self {
			continue // see aliveAfter
		}
		up := mem.State.Up()
		_, wasDown := m.memberDown[mem.Name]
		switch {
		case !up && !wasDown:
			m.memberDown[mem.Name] = now
			delete(m.memberBack, mem.Name)
			m.gen++
		case !up:
		case wasDown:
			delete(m.memberDown, mem.Name)
			m.memberBack[mem.Name] = now
			m.gen++
		}
		if !up {
			continue
		}
		if back, ok := m.memberBack[mem.Name]; ok {
			if now.Sub(back) < m.settle {
				continue
			}
			delete(m.memberBack, mem.Name)
			m.gen++
		}
		f(mem.Name)
	}
}

// downSince is when this node first saw member name down (ok false if it
// has not).
func (m *members) downSince(name string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.memberDown[name]
	return t, ok
}

// settling reports whether member name came back from down less than
// --rejoin-settle ago (see aliveAfter).
func (m *members) settling(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.memberBack[name]
	return ok
}
