package view

import (
	"maps"
	"slices"
	"sync"

	"github.com/starling-orchestrator/starling/net/service"
)

// The view's ports by Service (portShards) and the changed Services
// handed from the view builder to the services loop (serviceChanges).

// AllPorts returns every port of v's Services, sorted by Service key.
func (v *View) AllPorts() []service.Port {
	var keys []string
	v.SvcPorts.each(func(key string, _ []service.Port) { keys = append(keys, key) })
	slices.Sort(keys)
	var out []service.Port
	for _, key := range keys {
		out = append(out, v.SvcPorts.Get(key)...)
	}
	return out
}

// portShards holds ports by Service key in shards, copied on write
// (with): a view that changes a few Services copies their shards, not
// every Service's entry. Never modified once built; the nil *portShards
// holds nothing.
type portShards [256]map[string][]service.Port

// shardOf is key's shard: FNV-1a (Fowler, Noll and Vo) of the key.
func shardOf(key string) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return int(h % uint32(len(portShards{})))
}

func newPortShards(ports map[string][]service.Port) *portShards {
	var s portShards
	for k, ps := range ports {
		i := shardOf(k)
		if s[i] == nil {
			s[i] = map[string][]service.Port{}
		}
		s[i][k] = ps
	}
	return &s
}

// Get returns the ports of Service key (none: no such Service, or no
// allocated ClusterIP).
func (s *portShards) Get(key string) []service.Port {
	if s == nil {
		return nil
	}
	return s[shardOf(key)][key]
}

// each calls f for every Service with ports, in no order.
func (s *portShards) each(f func(key string, ports []service.Port)) {
	if s == nil {
		return
	}
	for _, m := range s {
		for k, ps := range m {
			f(k, ps)
		}
	}
}

// Len returns the number of Services with ports.
func (s *portShards) Len() int {
	n := 0
	if s != nil {
		for _, m := range s {
			n += len(m)
		}
	}
	return n
}

// with returns s with the Services of changes given their ports (none:
// removed), copying only the shards they fall in.
func (s *portShards) with(changes map[string][]service.Port) *portShards {
	if len(changes) == 0 {
		return s
	}
	var out portShards
	if s != nil {
		out = *s
	}
	copied := map[int]bool{}
	for k, ps := range changes {
		i := shardOf(k)
		if !copied[i] {
			out[i], copied[i] = maps.Clone(out[i]), true
			if out[i] == nil {
				out[i] = map[string][]service.Port{}
			}
		}
		if len(ps) == 0 {
			delete(out[i], k)
		} else {
			out[i][k] = ps
		}
	}
	return &out
}

// serviceChanges gathers the keys of the Services whose ports changed in
// the views stored since the services loop last took them (all: every
// Service may have). Keys are noted as their view is stored, before the
// loop is woken: the loop, which takes them after it has the channel of
// the next view and before it loads the current one, only ever reads
// them with their view or a newer one.
type serviceChanges struct {
	mu   sync.Mutex
	keys map[string]bool
	all  bool
}

func (c *serviceChanges) note(keys []string) {
	if len(keys) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[string]bool{}
	}
	for _, k := range keys {
		c.keys[k] = true
	}
}

func (c *serviceChanges) noteAll() {
	c.mu.Lock()
	c.all = true
	c.mu.Unlock()
}

// Take returns and forgets the keys noted (all: every Service may have
// changed).
func (c *serviceChanges) Take() (keys []string, all bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys, all = slices.Collect(maps.Keys(c.keys)), c.all
	c.keys, c.all = nil, false
	return keys, all
}

// TakeServiceChanges returns and forgets the keys of the Services whose
// ports changed in the views stored since the last call (all: every
// Service may have changed, as before the first call). The services
// loop takes them before it loads the view, so the view it loads holds
// those changes or newer ones.
func (vs *Builder) TakeServiceChanges() (keys []string, all bool) { return vs.svcChanges.Take() }
