package view

import (
	"net/netip"
	"sync"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// Checked holds what the arrival check of records (node/verify.go)
// decoded of the records it accepted (every check passed, signature
// included), by record key, the newest version of each: node statuses and
// desired objects. The view takes them from here instead of decoding the
// same record again, so a record from a peer is decoded once per change
// on a node. Safe for concurrent use; it calls nothing.
type Checked struct {
	mu       sync.Mutex
	statuses map[string]cachedStatus
	objects  map[string]cachedObject
}

// maxChecked bounds each map of Checked: one entry per key accepted and
// not yet read by the view (a decoding the view never takes, because the
// store kept another version, is dropped when the map fills).
const maxChecked = 4096

// NewChecked returns an empty Checked.
func NewChecked() *Checked {
	return &Checked{statuses: map[string]cachedStatus{}, objects: map[string]cachedObject{}}
}

// Note keeps s, decoded from status record r (cluster is
// --cluster-cidr), unless a newer version of r's key is kept. A nil c
// keeps nothing.
func (c *Checked) Note(r crdt.Record, s NodeStatus, cluster netip.Prefix) {
	if c == nil {
		return
	}
	e := cachedStatus{from: idOf(r), status: s}
	e.ok = finishStatus(&e.status, r, cluster)
	c.mu.Lock()
	defer c.mu.Unlock()
	keepNewest(c.statuses, r, e, func(e cachedStatus) recordID { return e.from })
}

// NoteObject keeps o, decoded from object record r by manifest.Decode,
// unless a newer version of r's key is kept. A nil c keeps nothing.
func (c *Checked) NoteObject(r crdt.Record, o manifest.Object) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	keepNewest(c.objects, r, cachedObject{from: idOf(r), obj: o, ok: true}, func(e cachedObject) recordID { return e.from })
}

// keepNewest puts e, decoded from r, into m unless m holds a newer
// version of r's key; a full m starts over before it takes a new key.
func keepNewest[E any](m map[string]E, r crdt.Record, e E, from func(E) recordID) {
	old, ok := m[r.Key]
	if ok && from(old).version.Compare(r.Version) > 0 {
		return
	}
	if !ok && len(m) >= maxChecked {
		clear(m)
	}
	m[r.Key] = e
}

// Holds reports whether c keeps a decoding of exactly r (for tests of
// what notes it).
func (c *Checked) Holds(r crdt.Record) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.statuses[r.Key]; ok && e.from.same(r) {
		return true
	}
	e, ok := c.objects[r.Key]
	return ok && e.from.same(r)
}

// take returns, and forgets, the status decoded from r on arrival (never
// from a nil c).
func (c *Checked) take(r crdt.Record) (cachedStatus, bool) {
	if c == nil {
		return cachedStatus{}, false
	}
	return takeSame(&c.mu, c.statuses, r, func(e cachedStatus) recordID { return e.from })
}

// takeObject returns, and forgets, the object decoded from r on arrival
// (never from a nil c).
func (c *Checked) takeObject(r crdt.Record) (cachedObject, bool) {
	if c == nil {
		return cachedObject{}, false
	}
	return takeSame(&c.mu, c.objects, r, func(e cachedObject) recordID { return e.from })
}

// takeSame removes and returns the entry of r's key in m (guarded by
// mu), when it was decoded from exactly r.
func takeSame[E any](mu *sync.Mutex, m map[string]E, r crdt.Record, from func(E) recordID) (E, bool) {
	mu.Lock()
	defer mu.Unlock()
	e, ok := m[r.Key]
	if !ok || !from(e).same(r) {
		var zero E
		return zero, false
	}
	delete(m, r.Key)
	return e, true
}
