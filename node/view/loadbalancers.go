package view

import (
	"maps"
	"net/http"
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// LBPool returns the cluster's LoadBalancer pool (the ConfigMap
// manifest.LBPoolName in manifest.LBPoolNamespace), and false when none is
// set or what is set does not parse (its writer's node refused it; a peer
// wrote it anyway).
func (v *View) LBPool() (netip.Prefix, bool) {
	if v.Config == nil {
		return netip.Prefix{}, false
	}
	data, _, ok := v.Config.ConfigMap(manifest.LBPoolNamespace, manifest.LBPoolName)
	if !ok {
		return netip.Prefix{}, false
	}
	p, err := manifest.ParseLBPool(data[manifest.LBPoolKey])
	return p, err == nil
}

// NodeAddrs returns the nodes' own addresses, from their records: never a
// LoadBalancer address.
func (v *View) NodeAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, s := range v.Statuses {
		if a, err := netip.ParseAddr(s.HostIP()); err == nil {
			out[a] = true
		}
	}
	return out
}

// lbInto sets v.Alloc.LoadBalancers, the LAN address of each
// LoadBalancer Service (service.AllocateLB: from the pool, or its
// spec.loadBalancerIP if the pool holds it; never a node's address nor
// one of forbidden, the service and cluster CIDRs), and
// v.Alloc.LBPending, why the others have none, the same on every node
// holding the same records. v.Alloc is copied only when they differ from
// what it holds, and lbChanged says so (every Service's ports are
// computed again). Called with build held, for each view derived.
func lbInto(v, prev *View, forbidden []netip.Prefix) {
	if prev != nil && !v.Changes.Objects && !v.Changes.Config && !v.Changes.Statuses {
		return // v.Alloc is prev's
	}
	var svcs []manifest.Object
	for _, o := range v.Services {
		if o.Service.Spec.Type == corev1.ServiceTypeLoadBalancer {
			svcs = append(svcs, o)
		}
	}
	var lbs map[string]netip.Addr
	var pending map[string]string
	if len(svcs) > 0 {
		pool, _ := v.LBPool()
		nodes := v.NodeAddrs()
		lbs, pending = service.AllocateLB(ServiceSpecs(svcs), service.LBPool{Prefix: pool, Forbidden: forbidden, Reserved: func(a netip.Addr) bool { return nodes[a] }})
	}
	if maps.Equal(lbs, v.Alloc.LoadBalancers) && maps.Equal(pending, v.Alloc.LBPending) {
		return
	}
	alloc := v.Alloc
	alloc.LoadBalancers, alloc.LBPending = lbs, pending
	v.Alloc, v.lbChanged = alloc, true
}

// lbForbidden are the ranges no LoadBalancer address may lie in: the
// service CIDR and the cluster (pod) CIDR of c.
func lbForbidden(c Config) []netip.Prefix {
	out := []netip.Prefix{c.ClusterCIDR}
	if c.ServiceCIDR != nil {
		if a, ok := netip.AddrFromSlice(c.ServiceCIDR.IP.To4()); ok {
			ones, _ := c.ServiceCIDR.Mask.Size()
			out = append(out, netip.PrefixFrom(a, ones).Masked())
		}
	}
	return out
}

// externalLocal reports whether Service o keeps its clients' addresses
// with the external traffic policy Local.
func externalLocal(o manifest.Object) bool {
	return o.Service.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

// AdmitLBPool refuses, among objs, a LoadBalancer pool setting (the
// ConfigMap manifest.LBPoolName) that overlaps the service or the
// cluster CIDR: the nodes would ignore it (lbForbidden), so the apply
// says so instead, naming the field.
func (vs *Builder) AdmitLBPool(objs []manifest.Object) error {
	for _, o := range objs {
		if o.ConfigMap == nil || o.Namespace != manifest.LBPoolNamespace || o.Name != manifest.LBPoolName {
			continue
		}
		pool, err := manifest.ParseLBPool(o.ConfigMap.Data[manifest.LBPoolKey])
		if err != nil {
			continue // validation names it
		}
		for _, f := range lbForbidden(vs.cfg) {
			if f.IsValid() && f.Overlaps(pool) {
				return api.Errorf(http.StatusUnprocessableEntity, "configmap %s/%s: data[%s]: Invalid value: %q: overlaps the cluster's %s (the service or the pod CIDR): choose a range of the nodes' LAN",
					o.Namespace, o.Name, manifest.LBPoolKey, pool.String(), f)
			}
		}
	}
	return nil
}
