package manifest

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The LoadBalancer pool is a cluster setting, held as a ConfigMap every
// node reads from its view (so every node allocates the same addresses):
// LBPoolName in LBPoolNamespace, its CIDR under the key LBPoolKey.
// `starling cluster lb-pool CIDR` writes it.
const (
	LBPoolNamespace = "starling-system"
	LBPoolName      = "lb-pool"
	LBPoolKey       = "cidr"
	// lbPoolMinBits bounds the pool: at most a /16 (65,536 addresses),
	// far more than a LAN gives Services, and a typo such as /2 refused.
	lbPoolMinBits = 16
)

// lbPoolExample is what an error shows as a pool that would do.
const lbPoolExample = "e.g. 192.168.1.240/28, a range of the nodes' LAN that its DHCP server does not give out"

// ParseLBPool reads a LoadBalancer pool: an IPv4 CIDR, written masked
// (192.168.1.240/28, not 192.168.1.241/28), between a /16 and a /32. The
// error says what is wrong and what would do.
func ParseLBPool(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		return netip.Prefix{}, fmt.Errorf("must be an IPv4 CIDR (%s)", lbPoolExample)
	case !p.Addr().Is4():
		return netip.Prefix{}, fmt.Errorf("must be an IPv4 CIDR: IPv6 LoadBalancer addresses are not supported yet (%s)", lbPoolExample)
	case p.Bits() < lbPoolMinBits:
		return netip.Prefix{}, fmt.Errorf("must be at most a /%d: a /%d is larger than any LAN's spare range (%s)", lbPoolMinBits, p.Bits(), lbPoolExample)
	case p.Masked() != p:
		return netip.Prefix{}, fmt.Errorf("must start at its network address: use %s", p.Masked())
	case p.Addr().IsLoopback() || p.Addr().IsMulticast() || p.Addr().IsUnspecified() || p.Addr().IsLinkLocalUnicast():
		return netip.Prefix{}, fmt.Errorf("must be a unicast range of the nodes' LAN, not %s (%s)", p, lbPoolExample)
	}
	return p, nil
}

// validateLBPool checks the pool setting's ConfigMap.
func validateLBPool(c *corev1.ConfigMap) field.ErrorList {
	p := field.NewPath("data").Key(LBPoolKey)
	s, ok := c.Data[LBPoolKey]
	if !ok {
		return field.ErrorList{field.Required(p, "the LoadBalancer pool, an IPv4 CIDR ("+lbPoolExample+"); set it with `starling cluster lb-pool CIDR`")}
	}
	if _, err := ParseLBPool(s); err != nil {
		return field.ErrorList{field.Invalid(p, s, err.Error())}
	}
	return nil
}

// validateLoadBalancer checks what type LoadBalancer adds to a Service:
// spec.loadBalancerIP, a unicast IPv4 address (every node then gives it
// only if the pool holds it and no node, Service CIDR or pod CIDR does:
// service.AllocateLB, which sees peers' records this check never saw;
// the node that announces it checks that its LAN holds it), and externalTrafficPolicy
// Local, which only a LoadBalancer Service's LAN address honours.
func validateLoadBalancer(s *corev1.ServiceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if s.LoadBalancerIP != "" {
		lp := p.Child("loadBalancerIP")
		a, err := netip.ParseAddr(s.LoadBalancerIP)
		switch {
		case s.Type != corev1.ServiceTypeLoadBalancer:
			errs = append(errs, field.Forbidden(lp, "may only be set when `type` is 'LoadBalancer'"))
		case err != nil || !a.Is4():
			errs = append(errs, field.Invalid(lp, s.LoadBalancerIP, "must be an IPv4 address of the nodes' LAN (or leave it empty to get one from the pool: `starling cluster lb-pool CIDR`)"))
		case a.IsLoopback() || a.IsMulticast() || a.IsUnspecified() || a.IsLinkLocalUnicast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
			errs = append(errs, field.Invalid(lp, s.LoadBalancerIP, "must be a unicast address of the nodes' LAN"))
		}
	}
	if s.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && s.Type != corev1.ServiceTypeLoadBalancer {
		errs = append(errs, field.Invalid(p.Child("externalTrafficPolicy"), s.ExternalTrafficPolicy,
			"'Local' is supported for `type` 'LoadBalancer' only (its LAN address); use 'Cluster' for a NodePort Service"))
	}
	return errs
}
