package service

import (
	"cmp"
	"net/netip"
	"slices"
)

// portKey identifies one Service port: what its chains and map entries are
// named after. A struct, not a joined string, so looking a port up costs
// no allocation.
type portKey struct {
	Service, Name string
	Protocol      Protocol
}

func (k portKey) String() string { return k.Service + ":" + k.Name + "/" + string(k.Protocol) }

func (p Port) key() portKey { return portKey{p.Service, p.Name, p.Protocol} }

func comparePorts(a, b Port) int {
	return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Protocol, b.Protocol))
}

// Model is the Service dataplane as this node programs it: every valid
// Service port, by Service, port name and protocol, with its endpoints
// checked (IPv4 with a port number), sorted and deduplicated. Backends
// render a Change, never the whole model, except for a full sync, so the
// cost of a sync follows what changed. The zero Model is empty and ready
// to use. A Model is not safe for concurrent use.
type Model struct {
	cfg   Config
	ports map[portKey]*modelPort
	seen  uint64 // Update's generation, to find removed ports
	// bySvc lists each Service's ports (UpdateServices). Built on first
	// use from ports; an Update that adds or removes ports drops it.
	bySvc map[string][]portKey
}

type modelPort struct {
	given []netip.AddrPort // the endpoints as last given, to see "unchanged" without sorting
	port  Port             // canonical
	seen  uint64
}

// Change is what one Update changed, each list sorted by Service, port
// name and protocol. A Change with Config set changed what every port's
// rules depend on: backends rewrite everything.
type Change struct {
	Added   []Port
	Updated []Replaced
	Removed []Port
	Config  bool
}

// Replaced is one port whose addresses, NodePort or endpoints changed.
type Replaced struct{ Old, New Port }

// Empty reports whether c changes nothing.
func (c Change) Empty() bool {
	return len(c.Added) == 0 && len(c.Updated) == 0 && len(c.Removed) == 0 && !c.Config
}

// Update makes the model hold ports (invalid ones are left out: see
// Port.valid) under cfg and returns what changed. Its cost is one map
// lookup and one comparison per port, plus sorting the changed ones: no
// rule is rendered for a port that did not change.
func (m *Model) Update(ports []Port, cfg Config) Change {
	if m.ports == nil {
		m.ports = map[portKey]*modelPort{}
	}
	m.seen++
	var c Change
	if cfg != m.cfg {
		c.Config = true
		m.cfg = cfg
	}
	kept := 0
	for _, p := range ports {
		if !p.valid() {
			continue
		}
		if mp, ok := m.ports[p.key()]; ok && mp.seen == m.seen {
			// A port given twice: the first one counts, as before.
			continue
		}
		if m.put(p, &c) {
			kept++
		}
	}
	if kept < len(m.ports)-len(c.Added) {
		for k, mp := range m.ports {
			if mp.seen != m.seen {
				c.Removed = append(c.Removed, mp.port)
				delete(m.ports, k)
			}
		}
	}
	if len(c.Added) > 0 || len(c.Removed) > 0 {
		m.bySvc = nil
	}
	c.sort()
	return c
}

// UpdateServices makes the model hold, for each Service key of svcs, the
// given ports and no others (an empty list: the Service has none), under
// cfg, and returns what changed. Services not in svcs keep their ports:
// its cost follows the ports given, not the size of the model (after the
// first call following an Update that added or removed ports, which
// indexes the model by Service once). Invalid ports (Port.valid), ports
// of another Service than their key and a port given twice (the first
// counts) are left out, as Update does.
func (m *Model) UpdateServices(svcs map[string][]Port, cfg Config) Change {
	if m.ports == nil {
		m.ports = map[portKey]*modelPort{}
	}
	if m.bySvc == nil {
		m.bySvc = map[string][]portKey{}
		for k := range m.ports {
			m.bySvc[k.Service] = append(m.bySvc[k.Service], k)
		}
	}
	var c Change
	if cfg != m.cfg {
		c.Config = true
		m.cfg = cfg
	}
	for svc, ports := range svcs {
		var keys []portKey
		for _, p := range ports {
			if !p.valid() || p.Service != svc {
				continue
			}
			k := p.key()
			if slices.Contains(keys, k) {
				continue
			}
			keys = append(keys, k)
			m.put(p, &c)
		}
		for _, k := range m.bySvc[svc] {
			if !slices.Contains(keys, k) {
				c.Removed = append(c.Removed, m.ports[k].port)
				delete(m.ports, k)
			}
		}
		if len(keys) == 0 {
			delete(m.bySvc, svc)
		} else {
			m.bySvc[svc] = keys
		}
	}
	c.sort()
	return c
}

// put makes the model hold p (valid, not given before in this update)
// and records in c what that changed: p added, or its port updated when
// its address, NodePort or endpoints differ. It reports whether p's key
// was held already.
func (m *Model) put(p Port, c *Change) (held bool) {
	k := p.key()
	mp, ok := m.ports[k]
	if !ok {
		mp = &modelPort{given: p.Endpoints, port: canonical(p), seen: m.seen}
		m.ports[k] = mp
		c.Added = append(c.Added, mp.port)
		return false
	}
	mp.seen = m.seen
	if sameGiven(mp, p) {
		return true
	}
	old := mp.port
	mp.given, mp.port = p.Endpoints, canonical(p)
	if !samePort(old, mp.port) {
		c.Updated = append(c.Updated, Replaced{Old: old, New: mp.port})
	}
	return true
}

// sort orders c's lists by Service, port name and protocol.
func (c *Change) sort() {
	slices.SortFunc(c.Added, comparePorts)
	slices.SortFunc(c.Removed, comparePorts)
	slices.SortFunc(c.Updated, func(a, b Replaced) int { return comparePorts(a.New, b.New) })
}

// Ports returns every port of the model, sorted by Service, port name and
// protocol (for a full sync, and the dry run).
func (m *Model) Ports() []Port {
	out := make([]Port, 0, len(m.ports))
	for _, mp := range m.ports {
		out = append(out, mp.port)
	}
	slices.SortFunc(out, comparePorts)
	return out
}

// Config returns the configuration of the last Update.
func (m *Model) Config() Config { return m.cfg }

// Len returns the number of ports the model holds.
func (m *Model) Len() int { return len(m.ports) }

// sameGiven reports whether p is what mp was last given: the same
// address, ports and endpoints in the same order.
func sameGiven(mp *modelPort, p Port) bool {
	return mp.port.ClusterIP == p.ClusterIP && mp.port.Port == p.Port && mp.port.NodePort == p.NodePort &&
		mp.port.LoadBalancer == p.LoadBalancer && mp.port.Local == p.Local && slices.Equal(mp.given, p.Endpoints)
}

func samePort(a, b Port) bool {
	return a.ClusterIP == b.ClusterIP && a.Port == b.Port && a.NodePort == b.NodePort && a.LoadBalancer == b.LoadBalancer && a.Local == b.Local &&
		slices.Equal(a.Endpoints, b.Endpoints)
}

// canonical returns p with only usable endpoints (IPv4, a port number),
// sorted and without duplicates, in a slice of its own.
func canonical(p Port) Port {
	eps := make([]netip.AddrPort, 0, len(p.Endpoints))
	for _, ep := range p.Endpoints {
		if ep.Addr().Is4() && ep.Port() != 0 {
			eps = append(eps, ep)
		}
	}
	slices.SortFunc(eps, func(a, b netip.AddrPort) int { return a.Compare(b) })
	p.Endpoints = slices.Compact(eps)
	return p
}
