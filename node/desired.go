package node

import (
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// defaultGracePeriod is Kubernetes' terminationGracePeriodSeconds default.
const defaultGracePeriod = 30 * time.Second

// liveObjects decodes the live (not deleted) records of one kind, sorted by
// key. Records that fail to decode are skipped and returned as bad keys,
// so one corrupt entry never stops the node from running the others.
func liveObjects(records []crdt.Record) (objs []manifest.Object, bad []string) {
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

// specOf derives the replica Spec from a Deployment's pod template (one
// container; manifest validation guarantees it).
func specOf(d *appsv1.Deployment) reconcile.Spec {
	c := d.Spec.Template.Spec.Containers[0]
	s := reconcile.Spec{
		Image:      c.Image,
		Command:    c.Command,
		Args:       c.Args,
		WorkingDir: c.WorkingDir,
		GracePeriod: func() time.Duration {
			if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
				return time.Duration(*g) * time.Second
			}
			return defaultGracePeriod
		}(),
	}
	for _, e := range c.Env {
		s.Env = append(s.Env, e.Name+"="+e.Value)
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

// replicasOf is a Deployment's spec.replicas (defaulted to 1 by manifest
// decoding, so the nil case only guards hand-built objects).
func replicasOf(d *appsv1.Deployment) int {
	if d.Spec.Replicas == nil {
		return 1
	}
	return int(*d.Spec.Replicas)
}

// desiredReplicas expands Deployments into all their replicas, cluster
// wide, ordinals 0..replicas-1, sorted by container ID; placement decides
// which of them this node runs.
func desiredReplicas(deployments []manifest.Object) []reconcile.Replica {
	var out []reconcile.Replica
	for _, o := range deployments {
		d := o.Deployment
		if d == nil {
			continue
		}
		n := replicasOf(d)
		hash, spec := manifest.SpecHash(d), specOf(d)
		for i := 0; i < n; i++ {
			out = append(out, reconcile.NewReplica(o.Namespace, o.Name, hash, i, spec))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// kindPrefix is the store key prefix of a kind ("deployment/").
func kindPrefix(kind string) string { return strings.ToLower(kind) + "/" }
