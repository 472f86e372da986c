package service

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"slices"
	"sort"
	"time"
)

// NodePortMin and NodePortMax bound NodePorts, as in Kubernetes.
const (
	NodePortMin = 30000
	NodePortMax = 32767
)

// Spec is what allocation needs of a Service.
type Spec struct {
	Key       string // "namespace/name"
	Created   time.Time
	ClusterIP netip.Addr // requested in the manifest, or the zero Addr
	NodePort  bool       // type NodePort
	// Headless: clusterIP None; it gets no ClusterIP (and so no rules).
	Headless bool
	// Ports: name -> requested nodePort (0: allocate).
	Ports []SpecPort
	// LoadBalancer: type LoadBalancer, which gets a LAN address
	// (AllocateLB); LoadBalancerIP is the one requested
	// in the manifest, or the zero Addr.
	LoadBalancer   bool
	LoadBalancerIP netip.Addr
}

// SpecPort is one port of a Spec.
type SpecPort struct {
	Name     string
	NodePort int32
}

// Allocation is the result: a ClusterIP per Service, a NodePort per
// "key/portName" of NodePort and LoadBalancer Services, and the LAN
// address of each LoadBalancer Service that has one (AllocateLB).
type Allocation struct {
	ClusterIPs    map[string]netip.Addr
	NodePorts     map[string]int32
	LoadBalancers map[string]netip.Addr
	// LBPending says why each LoadBalancer Service without an address
	// has none (AllocateLB).
	LBPending map[string]string
}

// Allocate gives every Service a ClusterIP in serviceCIDR and every
// NodePort Service port a NodePort, the same on every node: requested
// values first, in creation order (then key) so an older Service keeps
// what it has when a newer one asks for the same; the others get an
// address or port derived from a hash of their key, probing upwards past
// taken ones. The first and last addresses of the range are never used.
// A Service for which nothing is free gets none (absent from the maps).
func Allocate(specs []Spec, serviceCIDR *net.IPNet) Allocation {
	ss := append([]Spec(nil), specs...)
	sort.Slice(ss, func(i, j int) bool {
		if !ss[i].Created.Equal(ss[j].Created) {
			return ss[i].Created.Before(ss[j].Created)
		}
		return ss[i].Key < ss[j].Key
	})
	out := Allocation{ClusterIPs: map[string]netip.Addr{}, NodePorts: map[string]int32{}}
	ones, bits := serviceCIDR.Mask.Size()
	size := uint32(1) << (bits - ones)
	base := binary.BigEndian.Uint32(serviceCIDR.IP.To4())
	usedIP := map[uint32]bool{0: true, size - 1: true}
	usedPort := map[int32]bool{}
	offsetOf := func(a netip.Addr) (uint32, bool) {
		if !a.Is4() {
			return 0, false
		}
		ip := a.As4()
		if !serviceCIDR.Contains(ip[:]) {
			return 0, false
		}
		return binary.BigEndian.Uint32(ip[:]) - base, true
	}
	// Requested first.
	for _, s := range ss {
		if off, ok := offsetOf(s.ClusterIP); ok && !usedIP[off] {
			usedIP[off] = true
			out.ClusterIPs[s.Key] = s.ClusterIP
		}
		if !s.NodePort && !s.LoadBalancer {
			continue
		}
		for _, p := range s.Ports {
			if p.NodePort >= NodePortMin && p.NodePort <= NodePortMax && !usedPort[p.NodePort] {
				usedPort[p.NodePort] = true
				out.NodePorts[s.Key+"/"+p.Name] = p.NodePort
			}
		}
	}
	for _, s := range ss {
		if _, ok := out.ClusterIPs[s.Key]; !ok && !s.Headless {
			start := hash32(s.Key) % size
			for i := uint32(0); i < size; i++ {
				off := (start + i) % size
				if !usedIP[off] {
					usedIP[off] = true
					var ip [4]byte
					binary.BigEndian.PutUint32(ip[:], base+off)
					out.ClusterIPs[s.Key] = netip.AddrFrom4(ip)
					break
				}
			}
		}
		if !s.NodePort && !s.LoadBalancer {
			continue
		}
		for _, p := range s.Ports {
			k := s.Key + "/" + p.Name
			if _, ok := out.NodePorts[k]; ok {
				continue
			}
			span := uint32(NodePortMax - NodePortMin + 1)
			start := hash32(k) % span
			for i := uint32(0); i < span; i++ {
				port := int32(NodePortMin + (start+i)%span)
				if !usedPort[port] {
					usedPort[port] = true
					out.NodePorts[k] = port
					break
				}
			}
		}
	}
	return out
}

// LBPool is what AllocateLB gives LoadBalancer addresses from, and what
// it never gives.
type LBPool struct {
	// Prefix is the pool (IPv4; invalid: none). Wider than /31, its first
	// and last addresses (network and broadcast on a LAN) are never
	// given, requested or not.
	Prefix netip.Prefix
	// Forbidden are ranges no LoadBalancer address may lie in: the
	// service CIDR and the cluster (pod) CIDR, whose addresses every node
	// routes or NATs already. A pool that overlaps one gives nothing.
	Forbidden []netip.Prefix
	// Reserved says an address is taken whatever a Service asks (the
	// nodes' own); nil: none is.
	Reserved func(netip.Addr) bool
}

// lbProbes is how many addresses of its own pseudo-random sequence a
// Service tries before it scans the pool from its sequence's first (so a
// nearly full pool still gives its last free address).
const lbProbes = 64

// AllocateLB gives every LoadBalancer Service of specs a LAN address of
// pool.Prefix, the same on every node, and says why each one without an
// address has none (pending: absent from addrs, its reason in pending).
// Services take their address one at a time in creation order (then
// key), so an older Service never loses its address to a newer one: a
// Service that requests one (the manifest's loadBalancerIP) gets it if it is a
// usable address of the pool, not forbidden, not reserved and not taken
// by an older Service, and none otherwise; any other Service gets the
// first free address of a sequence of the pool's addresses that depends
// on its key alone (lbProbe). So deleting a Service frees its address
// and moves no Service older than it; a younger one moves only into the
// address freed by it or by another mover, and only if that address
// comes earlier in its own sequence (TestAllocateLBDeletionMovesOnlyYounger).
//
// Records come from any node: a request outside the pool is refused
// here, whatever the manifest's validation let through, so no Service
// can make its announcer take the LAN's gateway or another host's
// address, nor make every node NAT a ClusterIP or a pod's address.
func AllocateLB(specs []Spec, pool LBPool) (addrs map[string]netip.Addr, pending map[string]string) {
	ss := slices.Clone(specs)
	slices.SortFunc(ss, func(a, b Spec) int { return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.Key, b.Key)) })
	addrs, pending = map[string]netip.Addr{}, map[string]string{}
	first, span, why := usableLB(pool)
	owner := map[netip.Addr]string{}
	for _, s := range ss {
		if !s.LoadBalancer {
			continue
		}
		if why != "" {
			pending[s.Key] = why
			continue
		}
		if s.LoadBalancerIP.IsValid() {
			a := s.LoadBalancerIP
			off := offset(first, a)
			switch {
			case !a.Is4() || off >= uint64(span):
				pending[s.Key] = fmt.Sprintf("spec.loadBalancerIP %s is not a usable address of the pool %s (its first and last are not)", a, pool.Prefix)
			case pool.Reserved != nil && pool.Reserved(a):
				pending[s.Key] = fmt.Sprintf("spec.loadBalancerIP %s is a node's address", a)
			case owner[a] != "":
				pending[s.Key] = fmt.Sprintf("spec.loadBalancerIP %s is taken by the older Service %s", a, owner[a])
			default:
				owner[a], addrs[s.Key] = s.Key, a
			}
			continue
		}
		free := func(a netip.Addr) bool { return owner[a] == "" && (pool.Reserved == nil || !pool.Reserved(a)) }
		if a, ok := lbProbe(s.Key, first, span, free); ok {
			owner[a], addrs[s.Key] = s.Key, a
		} else {
			pending[s.Key] = fmt.Sprintf("the pool %s is full", pool.Prefix)
		}
	}
	return addrs, pending
}

// usableLB returns the first usable address of pool and how many there
// are, or why it gives none.
func usableLB(pool LBPool) (first netip.Addr, span uint32, why string) {
	p := pool.Prefix
	if !p.IsValid() || !p.Addr().Is4() {
		return netip.Addr{}, 0, "no LoadBalancer pool is set: `starling cluster lb-pool CIDR`"
	}
	p = p.Masked()
	for _, f := range pool.Forbidden {
		if f.IsValid() && f.Overlaps(p) {
			return netip.Addr{}, 0, fmt.Sprintf("the LoadBalancer pool %s overlaps %s (service or cluster CIDR): set another one", p, f)
		}
	}
	size := uint64(1) << (32 - p.Bits())
	first, span = p.Addr(), uint32(size)
	if size > 2 {
		first, span = first.Next(), uint32(size-2)
	}
	return first, span, ""
}

// offset is a's distance above first (IPv4 both), or a huge value when a
// is below it.
func offset(first, a netip.Addr) uint64 {
	if !a.Is4() || a.Less(first) {
		return 1 << 40
	}
	x, y := first.As4(), a.As4()
	return uint64(binary.BigEndian.Uint32(y[:]) - binary.BigEndian.Uint32(x[:]))
}

// lbProbe returns the first address free says is free of key's own
// sequence over the span addresses from first: lbProbes pseudo-random
// ones (FNV of key and the probe's number), then all of them upwards
// from the first probe. The sequence depends on key alone, so which
// other Services exist changes only which of its addresses are free.
func lbProbe(key string, first netip.Addr, span uint32, free func(netip.Addr) bool) (netip.Addr, bool) {
	at := func(off uint32) netip.Addr {
		b := first.As4()
		binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+off)
		return netip.AddrFrom4(b)
	}
	start := hash32("lb/"+key) % span
	for i := 0; i < lbProbes; i++ {
		off := start
		if i > 0 {
			off = hash32(fmt.Sprintf("lb/%s/%d", key, i)) % span
		}
		if a := at(off); free(a) {
			return a, true
		}
	}
	for i := uint32(0); i < span; i++ {
		if a := at((start + i) % span); free(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func hash32(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}
