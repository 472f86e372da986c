package view

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/manifest"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// AdmitServices checks the requested ClusterIPs and NodePorts of the
// Services in objs against the service range (--service-cidr) and the
// stored Services (those not being replaced by this batch). It is pure.
func AdmitServices(objs []manifest.Object, stored []manifest.Object, serviceCIDR string) error {
	var batch []manifest.Object
	replaced := map[string]bool{}
	for _, o := range objs {
		if o.Service != nil {
			batch = append(batch, o)
			replaced[o.Namespace+"/"+o.Name] = true
		}
	}
	if len(batch) == 0 {
		return nil
	}
	_, cidr, err := net.ParseCIDR(serviceCIDR)
	if err != nil {
		return err
	}
	svcRange := PrefixOf(cidr)
	var others []manifest.Object
	for _, o := range stored {
		if !replaced[o.Namespace+"/"+o.Name] {
			others = append(others, o)
		}
	}
	alloc := service.Allocate(ServiceSpecs(others), cidr)
	ipHolder := map[netip.Addr]string{}
	for k, ip := range alloc.ClusterIPs {
		ipHolder[ip] = k
	}
	portHolder := map[int32]string{}
	for k, p := range alloc.NodePorts {
		portHolder[p] = k[:strings.LastIndex(k, "/")]
	}
	var errs []error
	for _, o := range batch {
		key := o.Namespace + "/" + o.Name
		spec := &o.Service.Spec
		var fe field.ErrorList
		if spec.ClusterIP != "" && spec.ClusterIP != corev1.ClusterIPNone {
			p := field.NewPath("spec", "clusterIP")
			ip, err := netip.ParseAddr(spec.ClusterIP)
			last := lastAddr(svcRange)
			switch {
			case err != nil:
				fe = append(fe, field.Invalid(p, spec.ClusterIP, "must be a valid IPv4 address"))
			case !svcRange.Contains(ip):
				fe = append(fe, field.Invalid(p, spec.ClusterIP, fmt.Sprintf("provided IP is not in the valid range %s (--service-cidr); leave clusterIP empty to get one", svcRange)))
			case ip == svcRange.Addr() || ip == last:
				fe = append(fe, field.Invalid(p, spec.ClusterIP, fmt.Sprintf("%s and %s are reserved (the range's first and last addresses)", svcRange.Addr(), last)))
			case ipHolder[ip] != "":
				fe = append(fe, field.Invalid(p, spec.ClusterIP, fmt.Sprintf("provided IP is already allocated to Service %s", ipHolder[ip])))
			default:
				ipHolder[ip] = key
			}
		}
		for i, sp := range spec.Ports {
			if sp.NodePort == 0 {
				continue
			}
			if h := portHolder[sp.NodePort]; h != "" && h != key {
				fe = append(fe, field.Invalid(field.NewPath("spec", "ports").Index(i).Child("nodePort"), sp.NodePort,
					fmt.Sprintf("provided port is already allocated to Service %s", h)))
				continue
			}
			portHolder[sp.NodePort] = key
		}
		if len(fe) > 0 {
			errs = append(errs, fmt.Errorf("Service %s: %w", key, fe.ToAggregate()))
		}
	}
	return errors.Join(errs...)
}

// lastAddr returns the last address of an IPv4 prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
