// Package names keeps the node's DNS (node/dns) answering the cluster
// as the node's view holds it: it makes the zone's input from each new
// view (InputOf), writes it for the DNS server, and keeps that server's
// process running on the node's DNS address (Supervisor).
package names

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/dns"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/view"
)

// InputOf is the zone input of view v for the cluster domain: every
// Service with its ClusterIP (as allocated, the same on every node), an
// ExternalName Service's name, and a headless Service's ready
// endpoints, found as the dataplane finds them: the running, ready
// replicas of the workloads it selects, on the nodes whose addresses
// count (alive, winning their subnet claim, subnet ready; a record of an
// agent's earlier run adds none). Its pods are every replica of those
// nodes with an address in its node's subnet, ready or not (a pod's
// name and PTR are its address's, whatever it serves).
func InputOf(v *view.View, domain string) dns.Input {
	in := dns.Input{Domain: domain}
	eachPod(v, func(r api.Replica, ip netip.Addr) { in.Pods = append(in.Pods, dns.Pod{IP: ip, Namespace: r.Namespace}) })
	var ready map[string][]api.Replica // by workload key, made when a headless Service needs it
	for _, o := range v.Services {
		s := o.Service
		key := o.Namespace + "/" + o.Name
		svc := dns.Service{Name: o.Name, Namespace: o.Namespace}
		for _, p := range s.Spec.Ports {
			svc.Ports = append(svc.Ports, dns.Port{Name: p.Name, Protocol: string(p.Protocol), Port: uint16(p.Port)})
		}
		switch {
		case s.Spec.Type == corev1.ServiceTypeExternalName:
			svc.ExternalName, svc.Ports = s.Spec.ExternalName, nil
		case s.Spec.ClusterIP == corev1.ClusterIPNone:
			svc.Headless = true
			if ready == nil {
				ready = readyReplicas(v)
			}
			svc.Ports, svc.Endpoints = headless(o, v.SvcIndex.Matches[key], ready)
		default:
			ip, ok := v.Alloc.ClusterIPs[key]
			if !ok {
				continue
			}
			svc.ClusterIP = ip
		}
		in.Services = append(in.Services, svc)
	}
	return in
}

// headless is the ports (by target port, as SRV records give them) and
// the ready endpoints of headless Service o, which selects workloads.
func headless(o manifest.Object, workloads []manifest.Object, ready map[string][]api.Replica) ([]dns.Port, []dns.Endpoint) {
	var ports []dns.Port
	var eps []dns.Endpoint
	for _, sp := range o.Service.Spec.Ports {
		target := sp.Port
		if sp.TargetPort.Type == intstr.Int && sp.TargetPort.IntVal != 0 {
			target = sp.TargetPort.IntVal
		}
		for _, w := range workloads {
			if sp.TargetPort.Type == intstr.String {
				if t, ok := view.TargetPort(sp, w); ok {
					target = t
				}
			}
		}
		ports = append(ports, dns.Port{Name: sp.Name, Protocol: string(sp.Protocol), Port: uint16(target)})
	}
	for _, w := range workloads {
		for _, r := range ready[w.Namespace+"/"+w.Name] {
			ip, err := netip.ParseAddr(r.PodIP)
			if err != nil {
				continue
			}
			eps = append(eps, dns.Endpoint{IP: ip, Hostname: hostname(w, o.Name, r)})
		}
	}
	return ports, eps
}

// hostname is the name replica r of workload w has under headless
// Service svc: a StatefulSet's ordinal's name when svc governs it
// (its serviceName), a template's hostname when its subdomain is svc; ""
// otherwise.
func hostname(w manifest.Object, svc string, r api.Replica) string {
	t := w.PodTemplate()
	switch {
	case w.StatefulSet != nil && w.StatefulSet.Spec.ServiceName == svc:
		return r.Name
	case t.Spec.Subdomain == svc && t.Spec.Hostname != "":
		return t.Spec.Hostname
	}
	return ""
}

// readyReplicas are the running, ready replicas of the nodes whose
// addresses count (see InputOf), by workload key.
func readyReplicas(v *view.View) map[string][]api.Replica {
	out := map[string][]api.Replica{}
	eachPod(v, func(r api.Replica, _ netip.Addr) {
		if r.Available() {
			key := r.Namespace + "/" + r.Workload
			out[key] = append(out[key], r)
		}
	})
	return out
}

// eachPod calls f with each replica of the nodes whose addresses count
// (see InputOf) that has an address in its node's pod subnet.
func eachPod(v *view.View, f func(api.Replica, netip.Addr)) {
	for name, s := range v.Statuses {
		if !v.Alive[name] || !v.Winners[name] || !s.SubnetReady || v.Stale[name] {
			continue
		}
		subnet, err := netip.ParsePrefix(s.PodSubnet)
		if err != nil {
			continue
		}
		for _, r := range s.Replicas {
			if ip, err := netip.ParseAddr(r.PodIP); err == nil && subnet.Contains(ip) {
				f(r, ip)
			}
		}
	}
}
