package node

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

// serviceLinks returns the environment variables enableServiceLinks gives
// a container in namespace ns, by the kubelet's rules
// (pkg/kubelet/envvars FromServices): for every Service of ns with a
// ClusterIP (headless ones have none), by Service name, with NAME its
// name upper-cased and "-" made "_":
//
//	NAME_SERVICE_HOST=<clusterIP>  NAME_SERVICE_PORT=<first port>
//	NAME_SERVICE_PORT_<PORT NAME>=<port>            (named ports)
//	NAME_PORT=<proto>://<clusterIP>:<first port>
//	NAME_PORT_<port>_<PROTO>=<proto>://<clusterIP>:<port>, and its
//	_PROTO, _PORT and _ADDR                         (every port)
//
// Kubernetes also adds the "kubernetes" API Service of the default
// namespace; Starling has no such Service.
func serviceLinks(svcs []manifest.Object, alloc service.Allocation, ns string) []reconcile.EnvVar {
	var out []reconcile.EnvVar
	add := func(name, value string) { out = append(out, reconcile.EnvVar{Name: name, Value: value}) }
	envName := func(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }
	sorted := slices.Clone(svcs)
	slices.SortFunc(sorted, func(a, b manifest.Object) int { return strings.Compare(a.Name, b.Name) })
	for _, o := range sorted {
		s := o.Service
		if o.Namespace != ns || s == nil || s.Spec.ClusterIP == corev1.ClusterIPNone || len(s.Spec.Ports) == 0 {
			continue
		}
		ip, ok := alloc.ClusterIPs[o.Namespace+"/"+o.Name]
		if !ok {
			continue
		}
		prefix := envName(o.Name)
		add(prefix+"_SERVICE_HOST", ip.String())
		add(prefix+"_SERVICE_PORT", strconv.Itoa(int(s.Spec.Ports[0].Port)))
		for _, p := range s.Spec.Ports {
			if p.Name != "" {
				add(prefix+"_SERVICE_PORT_"+envName(p.Name), strconv.Itoa(int(p.Port)))
			}
		}
		for i, p := range s.Spec.Ports {
			proto := string(p.Protocol)
			if proto == "" {
				proto = string(corev1.ProtocolTCP)
			}
			url := strings.ToLower(proto) + "://" + netip.AddrPortFrom(ip, uint16(p.Port)).String()
			if i == 0 {
				add(prefix+"_PORT", url)
			}
			pp := fmt.Sprintf("%s_PORT_%d_%s", prefix, p.Port, strings.ToUpper(proto))
			add(pp, url)
			add(pp+"_PROTO", strings.ToLower(proto))
			add(pp+"_PORT", strconv.Itoa(int(p.Port)))
			add(pp+"_ADDR", ip.String())
		}
	}
	return out
}

// serviceEnv returns the Service variables of a namespace from the
// view's Services (serviceLinks), for reconcile.Decision.ServiceEnv.
func serviceEnv(v *view.View) func(namespace string) []reconcile.EnvVar {
	return func(ns string) []reconcile.EnvVar { return serviceLinks(v.Services, v.Alloc, ns) }
}
