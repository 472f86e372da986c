package view

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/member"
	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Reserved reports whether the subnet claim in a status record of
// version v still holds, its node being in membership state state: a
// live node's does, a down one's for reclaimAfter after its last write (a
// dead node stops writing, so its record's age is how long it has been
// gone).
func Reserved(state gossip.MemberState, v hlc.Timestamp, reclaimAfter time.Duration) bool {
	return state.Up() || time.Since(time.Unix(0, v.Wall)) <= reclaimAfter
}

// MemberState is the state of member name in ms, a membership sorted by
// name (gossip.Cluster.Members); ok false when ms does not hold it.
func MemberState(ms []gossip.Member, name string) (gossip.MemberState, bool) {
	i, ok := slices.BinarySearchFunc(ms, name, func(m gossip.Member, n string) int { return strings.Compare(m.Name, n) })
	if !ok {
		return "", false
	}
	return ms[i].State, true
}

// InsideCluster reports whether p is a network (no host bits) of prefix
// length cluster.Bits()+1 to 28 inside cluster.
func InsideCluster(p, cluster netip.Prefix) bool {
	return p.IsValid() && p == p.Masked() && p.Addr().Is4() && cluster.IsValid() &&
		p.Bits() > cluster.Bits() && p.Bits() <= 28 && cluster.Contains(p.Addr())
}

// ServiceSpecs is the allocation input of Services: requested ClusterIPs
// (parsed; an unparsable one counts as none) and NodePorts.
func ServiceSpecs(svcs []manifest.Object) []service.Spec {
	var specs []service.Spec
	for _, o := range svcs {
		s := o.Service
		ip, _ := netip.ParseAddr(s.Spec.ClusterIP)
		spec := service.Spec{Key: o.Namespace + "/" + o.Name, Created: s.CreationTimestamp.Time, ClusterIP: ip,
			NodePort: s.Spec.Type == corev1.ServiceTypeNodePort, LoadBalancer: s.Spec.Type == corev1.ServiceTypeLoadBalancer,
			// No ClusterIP, no rules: an ExternalName Service is a DNS name.
			Headless: s.Spec.ClusterIP == corev1.ClusterIPNone || s.Spec.Type == corev1.ServiceTypeExternalName}
		for _, p := range s.Spec.Ports {
			spec.Ports = append(spec.Ports, service.SpecPort{Name: p.Name, NodePort: p.NodePort})
		}
		spec.LoadBalancerIP, _ = netip.ParseAddr(s.Spec.LoadBalancerIP)
		specs = append(specs, spec)
	}
	return specs
}

// currentProbes returns each workload's current spec hash, by workload
// key, and the probes of its current template (ProbesKey), computed once
// per snapshot.
func currentProbes(workloads []manifest.Object) (hashes map[string]string, probes map[string]probe.Probes) {
	hashes, probes = map[string]string{}, map[string]probe.Probes{}
	for _, o := range workloads {
		if !o.IsWorkload() {
			continue
		}
		hash := specHashOf(o)
		hashes[reconcile.WorkloadKey(o.Namespace, o.Name)] = hash
		AddProbes(probes, o.Namespace, o.Name, hash, o.PodTemplate())
	}
	return hashes, probes
}

// AddProbes adds the probes of template t (of workload namespace/name,
// spec hash) to out, when it has any: its first container's under
// ProbesKey, each other container's (sidecars too) under
// ContainerProbesKey.
func AddProbes(out map[string]probe.Probes, namespace, name, hash string, t *corev1.PodTemplateSpec) {
	key := ProbesKey(namespace, name, hash)
	for i, c := range slices.Concat(t.Spec.Containers, t.Spec.InitContainers) {
		ps := probe.Probes{
			Startup:   probeSpec(c, c.StartupProbe),
			Liveness:  probeSpec(c, c.LivenessProbe),
			Readiness: probeSpec(c, c.ReadinessProbe),
		}
		if ps == (probe.Probes{}) {
			continue
		}
		if i == 0 {
			out[key] = ps
		} else {
			out[ContainerProbesKey(key, c.Name)] = ps
		}
	}
}

// ContainerProbesKey is the key of container name's probes among those
// of a template whose ProbesKey is key.
func ContainerProbesKey(key, name string) string { return key + "/" + name }

func ProbesKey(namespace, workload, hash string) string {
	return namespace + "/" + workload + "/" + hash
}

// probeSpec resolves one probe of container c (nil when not set, or when
// its handler cannot run: manifest validation rejects those).
func probeSpec(c corev1.Container, pr *corev1.Probe) *probe.Spec {
	if pr == nil {
		return nil
	}
	port := func(p intstr.IntOrString) int32 { return containerPort(c, p) }
	s := probe.Spec{
		InitialDelay:     time.Duration(pr.InitialDelaySeconds) * time.Second,
		Period:           time.Duration(max(pr.PeriodSeconds, 1)) * time.Second,
		Timeout:          time.Duration(max(pr.TimeoutSeconds, 1)) * time.Second,
		SuccessThreshold: int(pr.SuccessThreshold),
		FailureThreshold: int(pr.FailureThreshold),
	}
	switch {
	case pr.Exec != nil:
		if len(pr.Exec.Command) == 0 {
			return nil
		}
		s.Exec = pr.Exec.Command
		return &s
	case pr.HTTPGet != nil:
		h := pr.HTTPGet
		s.HTTP, s.HTTPS, s.HTTPPath = true, h.Scheme == corev1.URISchemeHTTPS, h.Path
		for _, hdr := range h.HTTPHeaders {
			s.HTTPHeaders = append(s.HTTPHeaders, probe.Header{Name: hdr.Name, Value: hdr.Value})
		}
		s.Port = port(h.Port)
	case pr.TCPSocket != nil:
		s.Port = port(pr.TCPSocket.Port)
	}
	if s.Port <= 0 {
		return nil
	}
	return &s
}

// containerPort resolves a port number or name of c's ports (0: no such
// name).
func containerPort(c corev1.Container, p intstr.IntOrString) int32 {
	if p.Type != intstr.String {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

// StaleRecords returns the live nodes (of alive) whose held record an
// earlier run of their agent wrote: its Started is before the run their
// metadata names. A node back from a crash is alive again, with the
// metadata of its new run, before its first record of that run reaches
// every peer (at 300 nodes, 12 s after the return, past --rejoin-settle),
// and its old record lists replicas that died with it, running since
// before the copies its peers started in its absence: taken at its word,
// placement.Keep gave them back to it and its peers stopped theirs.
// A stale record's copies are of unknown state: placement takes them as
// not running (away.go: any running copy is kept first, and with none
// the node keeps them), the rollout budget and make-before-break do not
// count them ready (node/decision.go, nodestatus.go), get replicas and rollout
// status show them Unknown, not ready (View.Reported), and they add no endpoint
// (serviceview.go; those already in rules stay: an agent restarted
// with its pods running). A node that only flapped, or was on the other
// side of a partition, keeps its run and its record stays current. A run
// started within the same second as the record's (Started is kept to the
// second) is not told apart. O(members) per view build.
func StaleRecords(members []gossip.Member, alive map[string]bool, statuses map[string]NodeStatus, self string) map[string]bool {
	var out map[string]bool
	for _, m := range members {
		if m.Name == self || !alive[m.Name] {
			continue
		}
		meta, ok := member.DecodeMeta(m.Meta)
		s, held := statuses[m.Name]
		if !ok || meta.Started == 0 || !held || s.Started.IsZero() {
			continue
		}
		if EarlierRun(s, time.Unix(0, meta.Started)) {
			if out == nil {
				out = map[string]bool{}
			}
			out[m.Name] = true
		}
	}
	return out
}

// Alive is a set of live members (Damping.AliveAfter) with what it was computed
// from: the membership snapshot and the flap-damping state's generation.
type Alive struct {
	Set  map[string]bool
	From []gossip.Member
	Gen  uint64
}
