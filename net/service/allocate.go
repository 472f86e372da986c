package service

import (
	"cmp"
	"encoding/binary"
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

// AllocateLB gives every LoadBalancer Service of specs a LAN address, the
// same on every node: a requested one (IPv4, not reserved) first, in
// creation order (then key), so an older Service keeps its address when a
// newer one asks for it; then an address of pool (IPv4; invalid: none)
// derived from a hash of the Service's key, probing upwards past taken
// ones. A pool wider than /31 never gives its first and last addresses
// (network and broadcast on a LAN), nor does any pool give an address
// reserved says is taken (the nodes' own). A Service for which nothing
// is free gets none (absent from the map: pending).
func AllocateLB(specs []Spec, pool netip.Prefix, reserved func(netip.Addr) bool) map[string]netip.Addr {
	ss := slices.Clone(specs)
	slices.SortFunc(ss, func(a, b Spec) int { return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.Key, b.Key)) })
	out := map[string]netip.Addr{}
	used := map[netip.Addr]bool{}
	taken := func(a netip.Addr) bool { return used[a] || reserved != nil && reserved(a) }
	for _, s := range ss {
		if s.LoadBalancer && s.LoadBalancerIP.Is4() && !taken(s.LoadBalancerIP) {
			used[s.LoadBalancerIP] = true
			out[s.Key] = s.LoadBalancerIP
		}
	}
	if !pool.IsValid() || !pool.Addr().Is4() {
		return out
	}
	pool = pool.Masked()
	size := uint32(1) << (32 - pool.Bits())
	first, last := uint32(0), size-1
	if size > 2 {
		first, last = 1, size-2
	}
	span := last - first + 1
	base := binary.BigEndian.Uint32(pool.Addr().AsSlice())
	for _, s := range ss {
		if _, ok := out[s.Key]; ok || !s.LoadBalancer || s.LoadBalancerIP.IsValid() {
			continue
		}
		start := hash32("lb/"+s.Key) % span
		for i := uint32(0); i < span; i++ {
			var ip [4]byte
			binary.BigEndian.PutUint32(ip[:], base+first+(start+i)%span)
			if a := netip.AddrFrom4(ip); !taken(a) {
				used[a] = true
				out[s.Key] = a
				break
			}
		}
	}
	return out
}

func hash32(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}
