package view

import (
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// defaultGracePeriod is Kubernetes' terminationGracePeriodSeconds default;
// minGracePeriod the kubelet's minimum (minimumGracePeriodInSeconds): a
// grace of 0 still sends the stop signal and waits 2 s before SIGKILL.
const (
	defaultGracePeriod = 30 * time.Second
	minGracePeriod     = 2 * time.Second
)

// LiveObjects decodes the live (not deleted) records of one kind, sorted by
// key. Records that fail to decode are skipped and returned as bad keys,
// so one corrupt entry never stops the node from running the others.
func LiveObjects(records []crdt.Record) (objs []manifest.Object, bad []string) {
	for _, r := range records {
		if r.Deleted {
			continue
		}
		o, err := manifest.Decode(r.Value)
		if err != nil {
			bad = append(bad, r.Key)
			continue
		}
		objs = append(objs, o)
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].Key() < objs[j].Key() })
	return objs, bad
}

// specOf derives the replica Spec from a workload's pod template (one
// container; manifest validation guarantees it).
func specOf(o manifest.Object) reconcile.Spec {
	t := o.PodTemplate()
	c := t.Spec.Containers[0]
	s := reconcile.Spec{
		Image:      c.Image,
		PullPolicy: string(c.ImagePullPolicy),
		Command:    c.Command,
		Args:       c.Args,
		WorkingDir: c.WorkingDir,
		GracePeriod: func() time.Duration {
			if g := t.Spec.TerminationGracePeriodSeconds; g != nil {
				return max(time.Duration(*g)*time.Second, minGracePeriod)
			}
			return defaultGracePeriod
		}(),
	}
	s.Hostname, s.Subdomain, s.DNSPolicy = t.Spec.Hostname, t.Spec.Subdomain, string(t.Spec.DNSPolicy)
	s.Security = securityOf(t.Spec.SecurityContext, c.SecurityContext)
	s.NoServiceLinks = t.Spec.EnableServiceLinks != nil && !*t.Spec.EnableServiceLinks
	if l := c.Lifecycle; l != nil {
		s.PostStart, s.PreStop = hookOf(c, l.PostStart), hookOf(c, l.PreStop)
	}
	for _, h := range t.Spec.HostAliases {
		s.HostAliases = append(s.HostAliases, reconcile.HostAlias{IP: h.IP, Hostnames: h.Hostnames})
	}
	if dc := t.Spec.DNSConfig; dc != nil {
		s.DNSConfig = &reconcile.DNSConfig{Nameservers: dc.Nameservers, Searches: dc.Searches}
		for _, o := range dc.Options {
			s.DNSConfig.Options = append(s.DNSConfig.Options, reconcile.DNSOption{Name: o.Name, Value: o.Value})
		}
	}
	for _, e := range c.Env {
		v := reconcile.EnvVar{Name: e.Name, Value: e.Value}
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			v.FieldPath = e.ValueFrom.FieldRef.FieldPath
		}
		s.Env = append(s.Env, v)
	}
	for _, p := range c.Ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(corev1.ProtocolTCP)
		}
		s.Ports = append(s.Ports, reconcile.Port{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: proto})
	}
	if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		s.CPUMillis = q.MilliValue()
	}
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		s.MemoryBytes = q.Value()
	}
	if q, ok := c.Resources.Requests[corev1.ResourceCPU]; ok {
		s.CPURequestMillis = q.MilliValue()
	}
	if q, ok := c.Resources.Requests[corev1.ResourceMemory]; ok {
		s.MemoryRequestBytes = q.Value()
	}
	return s
}

// hookOf resolves lifecycle handler h of container c (nil when not set;
// manifest validation rejects handlers that cannot run).
func hookOf(c corev1.Container, h *corev1.LifecycleHandler) *reconcile.Hook {
	switch {
	case h == nil:
		return nil
	case h.Exec != nil:
		return &reconcile.Hook{Exec: h.Exec.Command}
	case h.HTTPGet != nil:
		g := &reconcile.HTTPGetHook{HTTPS: h.HTTPGet.Scheme == corev1.URISchemeHTTPS, Host: h.HTTPGet.Host,
			Port: containerPort(c, h.HTTPGet.Port), Path: h.HTTPGet.Path}
		for _, hdr := range h.HTTPGet.HTTPHeaders {
			g.Headers = append(g.Headers, reconcile.HTTPHeader{Name: hdr.Name, Value: hdr.Value})
		}
		return &reconcile.Hook{HTTPGet: g}
	case h.Sleep != nil:
		return &reconcile.Hook{Sleep: time.Duration(h.Sleep.Seconds) * time.Second}
	}
	return nil
}

// specHashOf is the pod-template hash of a workload (manifest.SpecHash).
func specHashOf(o manifest.Object) string {
	if o.Deployment != nil {
		return manifest.SpecHash(o.Deployment)
	}
	return manifest.TemplateHash(o.PodTemplate())
}

// DesiredReplicas expands Deployments and StatefulSets into all their
// replicas, cluster wide, ordinals 0..replicas-1, sorted by container ID;
// placement decides which of them this node runs.
func DesiredReplicas(workloads []manifest.Object) []reconcile.Replica {
	var out []reconcile.Replica
	for _, o := range workloads {
		if !o.IsWorkload() {
			continue
		}
		n := o.Replicas()
		hash, spec := specHashOf(o), specOf(o)
		for i := 0; i < n; i++ {
			if o.StatefulSet != nil {
				out = append(out, reconcile.NewStatefulReplica(o.Namespace, o.Name, hash, i, spec))
			} else {
				out = append(out, reconcile.NewReplica(o.Namespace, o.Name, hash, string(o.Deployment.UID), i, spec))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// KindPrefix is the store key prefix of a kind ("deployment/").
func KindPrefix(kind string) string { return strings.ToLower(kind) + "/" }

// securityOf merges a container's securityContext over its pod's, as the
// kubelet does (a field set on the container wins).
func securityOf(pod *corev1.PodSecurityContext, c *corev1.SecurityContext) reconcile.Security {
	var s reconcile.Security
	if pod != nil {
		s.RunAsUser, s.RunAsGroup = pod.RunAsUser, pod.RunAsGroup
		s.RunAsNonRoot = pod.RunAsNonRoot != nil && *pod.RunAsNonRoot
		if pod.SeccompProfile != nil {
			s.Seccomp = string(pod.SeccompProfile.Type)
		}
	}
	if c == nil {
		return s
	}
	if c.RunAsUser != nil {
		s.RunAsUser = c.RunAsUser
	}
	if c.RunAsGroup != nil {
		s.RunAsGroup = c.RunAsGroup
	}
	if c.RunAsNonRoot != nil {
		s.RunAsNonRoot = *c.RunAsNonRoot
	}
	if c.SeccompProfile != nil {
		s.Seccomp = string(c.SeccompProfile.Type)
	}
	s.ReadOnlyRootFilesystem = c.ReadOnlyRootFilesystem != nil && *c.ReadOnlyRootFilesystem
	s.AllowPrivilegeEscalation = c.AllowPrivilegeEscalation
	if c.Capabilities != nil {
		for _, a := range c.Capabilities.Add {
			s.CapAdd = append(s.CapAdd, strings.TrimPrefix(string(a), "CAP_"))
		}
		for _, d := range c.Capabilities.Drop {
			s.CapDrop = append(s.CapDrop, strings.TrimPrefix(string(d), "CAP_"))
		}
	}
	return s
}
