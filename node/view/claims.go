package view

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/starling-orchestrator/starling/gossip"
)

// Claims is the node statuses this node held when a view was built, with
// their subnet claims indexed by /24: an immutable value. The arrival
// check (on gossip's goroutine), the subnet arbiter's answers and the
// claim check read it without the builder's lock and without the store;
// the builder hands a new one over with each view whose statuses
// changed (ClaimsFeed). A record accepted after that view is seen from
// the next one (ViewGap, about a second later): claims that the checks
// protect have settled long before.
type Claims struct {
	// statuses is the view's Statuses (never modified); names the nodes
	// whose record this node holds (a view may add this node's own
	// status before it is held: it is not a held claim).
	statuses map[string]NodeStatus
	names    map[string]bool
	// by holds the node names of the narrow claims by /24, wide those
	// of claims wider than a /24.
	by   map[netip.Prefix][]string
	wide []string
	// members is the view's membership (sorted by name).
	members []gossip.Member
}

// NewClaims indexes the claims of held, the statuses whose records this
// node holds, with the membership members (sorted by name).
func NewClaims(held map[string]NodeStatus, members []gossip.Member) *Claims {
	return newClaims(held, held, members)
}

// newClaims indexes the held claims of statuses (held: the names whose
// record this node holds).
func newClaims(statuses, held map[string]NodeStatus, members []gossip.Member) *Claims {
	c := &Claims{statuses: statuses, names: make(map[string]bool, len(held)), by: map[netip.Prefix][]string{}, members: members}
	for name, s := range held {
		c.names[name] = true
		p, ok := s.Prefix()
		if !ok {
			continue
		}
		if b, narrow := bucketOf(p); narrow {
			c.by[b] = append(c.by[b], name)
		} else {
			c.wide = append(c.wide, name)
		}
	}
	return c
}

// with returns c over statuses and members, the next view's, whose
// claims are c's (no claim changed: same names, same subnets).
func (c *Claims) with(statuses map[string]NodeStatus, members []gossip.Member) *Claims {
	return &Claims{statuses: statuses, names: c.names, by: c.by, wide: c.wide, members: members}
}

// Up reports whether member name is alive or suspect in the membership
// of the view these claims are of.
func (c *Claims) Up(name string) bool {
	if c == nil {
		return false
	}
	state, _ := MemberState(c.members, name)
	return state.Up()
}

// Reserved reports whether node name's claim still holds (Reserved): it
// is up in the membership, or its record (held) is younger than
// reclaimAfter. False for a node whose record is not held.
func (c *Claims) Reserved(name string, reclaimAfter time.Duration) bool {
	s, ok := c.Held(name)
	if !ok {
		return false
	}
	state, _ := MemberState(c.members, name)
	return Reserved(state, s.Version, reclaimAfter)
}

// Held returns node name's status as held (ok false: none).
func (c *Claims) Held(name string) (NodeStatus, bool) {
	if c == nil || !c.names[name] {
		return NodeStatus{}, false
	}
	s, ok := c.statuses[name]
	return s, ok
}

// Each calls f with every held status, in no order.
func (c *Claims) Each(f func(NodeStatus)) {
	if c == nil {
		return
	}
	for name := range c.names {
		if s, ok := c.statuses[name]; ok {
			f(s)
		}
	}
}

// Near returns the held statuses whose subnet claim overlaps s's (s's
// own held one included), found through the index: a new claim is
// checked against these, not against every node's. A claim that does
// not parse is compared by its text.
func (c *Claims) Near(s NodeStatus) []NodeStatus {
	if c == nil {
		return nil
	}
	var out []NodeStatus
	p, ok := s.Prefix()
	if !ok {
		c.Each(func(h NodeStatus) {
			if h.PodSubnet == s.PodSubnet {
				out = append(out, h)
			}
		})
		return out
	}
	take := func(name string) {
		if h, ok := c.Held(name); ok {
			if hp, ok := h.Prefix(); ok && hp.Overlaps(p) {
				out = append(out, h)
			}
		}
	}
	b, narrow := bucketOf(p.Masked())
	if !narrow {
		for name := range c.names {
			take(name)
		}
		return out
	}
	for _, name := range c.by[b] {
		take(name)
	}
	for _, name := range c.wide {
		take(name)
	}
	return out
}

// ClaimsFeed hands the latest Claims from the builder to its readers:
// made before the builder (the arrival check is made before gossip
// starts, and the builder reads gossip's membership), filled by each
// view built. The zero value is ready and holds no claims.
type ClaimsFeed struct {
	cur  atomic.Pointer[Claims]
	mu   sync.Mutex
	next chan struct{} // closed when newer claims are stored
}

// Load returns the latest Claims (nil, which holds none, before the
// first view).
func (f *ClaimsFeed) Load() *Claims {
	if f == nil {
		return nil
	}
	return f.cur.Load()
}

// Changed returns a channel closed when Claims newer than those Load
// returns now are stored.
func (f *ClaimsFeed) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.next == nil {
		f.next = make(chan struct{})
	}
	return f.next
}

// Store hands c over (the builder, with each view it builds).
func (f *ClaimsFeed) Store(c *Claims) {
	if f == nil {
		return
	}
	f.cur.Store(c)
	f.mu.Lock()
	if f.next != nil {
		close(f.next)
		f.next = nil
	}
	f.mu.Unlock()
}
