package dns

import (
	"container/list"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Cache holds upstream answers for as long as they may be kept: a
// positive answer for its records' smallest TTL, a negative one
// (NXDOMAIN, NODATA) for its SOA's negative TTL (RFC 2308), at most
// MaxTTL either way; a failure of every upstream for FailTTL (PutFailure,
// RFC 9520), else failures and truncated answers are not kept. It holds
// at most a bound of entries and MaxBytes of answers (their wire size),
// the least recently used going first, so a pod asking for many large
// answers cannot grow the server without bound. Safe for concurrent use.
type Cache struct {
	mu      sync.Mutex
	max     int
	bytes   int // the wire size of the answers kept
	entries map[cacheKey]*list.Element
	order   *list.List // of *cacheEntry, most recently used first
}

// MaxTTL bounds how long an answer is kept, whatever its TTL says;
// FailTTL is how long a failure of every upstream is (RFC 9520: at
// least 1 s). MaxBytes bounds the wire size of the answers kept (the
// process holds a few times that).
const (
	MaxTTL   = time.Hour
	FailTTL  = 2 * time.Second
	MaxBytes = 4 << 20
)

type cacheKey struct {
	name         string
	qtype, class uint16
	do           bool // the DNSSEC OK bit asked for (answers differ)
}

type cacheEntry struct {
	key     cacheKey
	msg     *dns.Msg
	size    int
	stored  time.Time
	expires time.Time
}

// NewCache makes a cache of at most max entries.
func NewCache(max int) *Cache {
	return &Cache{max: max, entries: map[cacheKey]*list.Element{}, order: list.New()}
}

func keyOf(q dns.Question, do bool) cacheKey {
	return cacheKey{strings.ToLower(q.Name), q.Qtype, q.Qclass, do}
}

// Get returns a copy of the answer kept for q at now, its TTLs lowered
// by the time it was kept, and whether there was one.
func (c *Cache) Get(q dns.Question, do bool, now time.Time) (*dns.Msg, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[keyOf(q, do)]
	if !ok {
		return nil, false
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.expires) {
		c.remove(el)
		return nil, false
	}
	c.order.MoveToFront(el)
	m := e.msg.Copy()
	age := uint32(now.Sub(e.stored) / time.Second)
	for _, section := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range section {
			if h := rr.Header(); h.Rrtype != dns.TypeOPT {
				h.Ttl = max(h.Ttl, age) - age
			}
		}
	}
	return m, true
}

// Put keeps answer m to q at now, for as long as it may be kept (see
// Cache); it reports whether it was kept.
func (c *Cache) Put(q dns.Question, do bool, m *dns.Msg, now time.Time) bool {
	ttl, ok := keepFor(m)
	if !ok {
		return false
	}
	return c.put(q, do, m.Copy(), now, ttl)
}

// PutFailure keeps, for FailTTL, that every upstream failed to answer q:
// the pods asking again meanwhile get SERVFAIL at once, not after the
// upstreams' timeouts again.
func (c *Cache) PutFailure(q dns.Question, do bool, now time.Time) {
	m := new(dns.Msg)
	m.Rcode = dns.RcodeServerFailure
	c.put(q, do, m, now, FailTTL)
}

func (c *Cache) put(q dns.Question, do bool, m *dns.Msg, now time.Time, ttl time.Duration) bool {
	size := m.Len()
	if c.max <= 0 || size > MaxBytes/16 {
		return false
	}
	e := &cacheEntry{key: keyOf(q, do), msg: m, size: size, stored: now, expires: now.Add(ttl)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[e.key]; ok {
		c.remove(el)
	}
	c.entries[e.key] = c.order.PushFront(e)
	c.bytes += size
	for c.order.Len() > c.max || c.bytes > MaxBytes {
		c.remove(c.order.Back())
	}
	return true
}

// remove drops el (c.mu held).
func (c *Cache) remove(el *list.Element) {
	e := c.order.Remove(el).(*cacheEntry)
	delete(c.entries, e.key)
	c.bytes -= e.size
}

// Bytes is the wire size of the answers kept.
func (c *Cache) Bytes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// Len is the number of entries kept (expired ones included until met).
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// keepFor is how long m may be kept: the smallest TTL of its answer
// records (positive), or of its SOA's TTL and minimum (negative); not at
// all for a failure or a truncated answer.
func keepFor(m *dns.Msg) (time.Duration, bool) {
	if m.Truncated || m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError {
		return 0, false
	}
	var ttl uint32
	found := false
	take := func(t uint32) {
		if !found || t < ttl {
			ttl, found = t, true
		}
	}
	if len(m.Answer) > 0 && m.Rcode == dns.RcodeSuccess {
		for _, rr := range m.Answer {
			take(rr.Header().Ttl)
		}
	} else {
		for _, rr := range m.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				take(min(soa.Hdr.Ttl, soa.Minttl))
			}
		}
	}
	if !found || ttl == 0 {
		return 0, false
	}
	return min(time.Duration(ttl)*time.Second, MaxTTL), true
}
