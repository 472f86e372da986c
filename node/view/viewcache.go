package view

import (
	"bytes"
	"cmp"
	"sort"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	corev1 "k8s.io/api/core/v1"
)

// The view builder's caches: decoded records by key, the statuses held
// (kept up to date from the store's changed keys) and the desired objects
// (snapshot.go builds the view from them).

// cachedObject and cachedStatus are decoded records with what they were
// decoded from: the version, origin and value (a tie or a reused version
// with another value must not keep the old decoding).
type cachedObject struct {
	from recordID
	obj  manifest.Object
	ok   bool
	// replicas are obj's replicas (DesiredReplicas), once expanded is
	// set (AllReplicas).
	replicas expansion
	expanded bool
}

// expansion is one workload's replicas in compact form: what they all
// share (tmpl, a Replica without ID, Name and Ordinal) and, sorted by ID,
// what each has of its own. A replica costs 40 bytes in it, where a
// reconcile.Replica is about 500 (its Spec): a cache of every workload's
// Replicas would double what a node holds of the cluster's replicas.
type expansion struct {
	tmpl *reconcile.Replica
	refs []ReplicaRef
}

type ReplicaRef struct {
	Id, name string
	ordinal  int
}

// expand is DesiredReplicas of o alone, in compact form.
func expand(o manifest.Object) expansion {
	rs := DesiredReplicas([]manifest.Object{o})
	e := expansion{refs: make([]ReplicaRef, len(rs))}
	for i, r := range rs {
		e.refs[i] = ReplicaRef{r.ID, r.Name, r.Ordinal}
	}
	if len(rs) > 0 {
		t := rs[0]
		t.ID, t.Name, t.Ordinal = "", "", 0
		e.tmpl = &t
	}
	return e
}

type cachedStatus struct {
	from   recordID
	status NodeStatus
	ok     bool
}

// recordID is what a cache entry was decoded from. The value is kept as
// the record held it and compared byte for byte: converting it to a
// string for each record on each rebuild copied every status record, 10
// % of the CPU at 1,000 simulated nodes.
type recordID struct {
	version hlc.Timestamp
	origin  string
	value   []byte
	signer  []byte
	sig     []byte
}

func idOf(r crdt.Record) recordID { return recordID{r.Version, r.Origin, r.Value, r.Signer, r.Sig} }

// same reports whether r is the record id was taken from, signature
// included: a copy of a record re-signed by another key is another
// record (the arrival check refuses it; what was decoded from it must
// not stand for the record held).
func (id recordID) same(r crdt.Record) bool {
	return id.version == r.Version && id.origin == r.Origin && bytes.Equal(id.value, r.Value) &&
		bytes.Equal(id.signer, r.Signer) && bytes.Equal(id.sig, r.Sig)
}

// objectsInto sets v's desired objects and what is computed from them,
// sharing prev's when none of their records changed (by the store's
// changed keys, then by the records themselves).
func (vs *Builder) objectsInto(v, prev *View) error {
	if !v.Changes.Objects {
		v.objectsKey, v.workloadsKey = prev.objectsKey, prev.workloadsKey
		v.Workloads, v.All, v.Services, v.Alloc, v.SvcIndex, v.Hashes, v.Probes = prev.Workloads, prev.All, prev.Services, prev.Alloc, prev.SvcIndex, prev.Hashes, prev.Probes
		v.ClaimObjects, v.ClaimRecords = prev.ClaimObjects, prev.ClaimRecords
		return nil
	}
	var wrecs []crdt.Record
	for _, kind := range []string{manifest.KindDeployment, manifest.KindStatefulSet} {
		rs, err := vs.cfg.Records.List(KindPrefix(kind))
		if err != nil {
			return err
		}
		wrecs = append(wrecs, rs...)
	}
	srecs, err := vs.cfg.Records.List(KindPrefix(manifest.KindService))
	if err != nil {
		return err
	}
	crecs, err := vs.cfg.Records.List(KindPrefix(manifest.KindPersistentVolumeClaim))
	if err != nil {
		return err
	}
	v.objectsKey = recordsKey(wrecs) + "|" + recordsKey(srecs) + "|" + recordsKey(crecs)
	if prev != nil && prev.objectsKey == v.objectsKey {
		v.workloadsKey = prev.workloadsKey
		v.Workloads, v.All, v.Services, v.Alloc, v.SvcIndex, v.Hashes, v.Probes = prev.Workloads, prev.All, prev.Services, prev.Alloc, prev.SvcIndex, prev.Hashes, prev.Probes
		v.ClaimObjects, v.ClaimRecords = prev.ClaimObjects, prev.ClaimRecords
		return nil
	}
	seen := map[string]bool{}
	v.Workloads = vs.DecodeObjects(wrecs, seen)
	v.Services = vs.DecodeObjects(srecs, seen)
	v.ClaimObjects = vs.DecodeObjects(crecs, seen)
	v.ClaimRecords = map[string]bool{}
	for _, r := range crecs {
		if !r.Deleted {
			v.ClaimRecords[strings.TrimPrefix(r.Key, KindPrefix(manifest.KindPersistentVolumeClaim))] = true
		}
	}
	for k := range vs.objects {
		if !seen[k] {
			delete(vs.objects, k)
		}
	}
	if vs.cfg.Share != nil {
		v.All = vs.cfg.Share.replicaSet(recordsKey(wrecs), func() []DesiredReplica { return vs.AllReplicas(wrecs) })
	} else {
		v.All = vs.AllReplicas(wrecs)
	}
	v.Hashes, v.Probes = currentProbes(v.Workloads)
	v.Alloc = service.Allocate(ServiceSpecs(v.Services), vs.cfg.ServiceCIDR)
	v.SvcIndex = NewServiceIndex(v.Services, v.Workloads)
	v.workloadsKey = workloadsKey(v.Workloads)
	return nil
}

// AllReplicas is DesiredReplicas of the workloads decoded from recs (by
// DecodeObjects, just before), from the expansion cached with each
// object: a write expands only its own workload's replicas, and the
// others are merged in, in ID order.
func (vs *Builder) AllReplicas(recs []crdt.Record) []DesiredReplica {
	var parts []expansion
	total := 0
	for _, r := range recs {
		c, ok := vs.objects[r.Key]
		if r.Deleted || !ok || !c.ok || !c.obj.IsWorkload() {
			continue
		}
		if !c.expanded {
			c.replicas, c.expanded = expand(c.obj), true
			vs.objects[r.Key] = c
			vs.cfg.Share.putObject(r, c)
		}
		parts = append(parts, c.replicas)
		total += len(c.replicas.refs)
	}
	return mergeByID(parts, total)
}

// mergeByID merges expansions into one slice of total replicas sorted by
// ID: a k-way merge through a heap of the expansions' heads, O(total log
// k) comparisons and one write of each replica.
func mergeByID(parts []expansion, total int) []DesiredReplica {
	if total == 0 {
		return nil
	}
	out := make([]DesiredReplica, 0, total)
	h := make([]expansion, 0, len(parts))
	for _, p := range parts {
		if len(p.refs) > 0 {
			h = append(h, p)
		}
	}
	less := func(i, j int) bool { return h[i].refs[0].Id < h[j].refs[0].Id }
	down := func(i int) {
		for {
			l, m := 2*i+1, i
			if l < len(h) && less(l, m) {
				m = l
			}
			if r := l + 1; r < len(h) && less(r, m) {
				m = r
			}
			if m == i {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		down(i)
	}
	for len(h) > 0 {
		out = append(out, DesiredReplica{h[0].refs[0], h[0].tmpl})
		if h[0].refs = h[0].refs[1:]; len(h[0].refs) == 0 {
			h[0] = h[len(h)-1]
			h = h[:len(h)-1]
		}
		down(0)
	}
	return out
}

// DecodeObjects returns the live objects of recs, sorted by key, decoding
// only records whose version changed since the last build; it marks their
// keys in seen. Objects that do not decode are logged once and skipped.
func (vs *Builder) DecodeObjects(recs []crdt.Record, seen map[string]bool) []manifest.Object {
	var out []manifest.Object
	for _, r := range recs {
		if r.Deleted {
			continue
		}
		seen[r.Key] = true
		c, ok := vs.objects[r.Key]
		if !ok || !c.from.same(r) {
			if checked, ok := vs.cfg.Checked.takeObject(r); ok {
				c = checked
				vs.cfg.Share.putObject(r, c)
			} else if shared, ok := vs.cfg.Share.object(r); ok {
				c = shared
			} else {
				o, err := manifest.Decode(r.Value)
				c = cachedObject{from: idOf(r), obj: o, ok: err == nil}
				if err != nil {
					vs.cfg.Log.Error("stored object does not decode; skipped", "key", r.Key, "err", err)
				}
				vs.cfg.Share.putObject(r, c)
			}
			vs.objects[r.Key] = c
		}
		if c.ok {
			out = append(out, c.obj)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// sync brings held (and the status cache) up to date with the store's
// changed keys, and notes what changed in pending. Only the changed records are read and decoded; a
// purge, a drop or the first sync relists them all. Called with build
// held.
func (vs *Builder) sync() error {
	keys, all := vs.cfg.Records.Take()
	// A read that fails leaves the changes unread: the next sync reads
	// everything again.
	failed := func(err error) error {
		vs.cfg.Records.SetAll()
		return err
	}
	if all {
		recs, err := vs.cfg.Records.List(StatusKind + "/")
		if err != nil {
			return failed(err)
		}
		vs.held = vs.decodeStatusesCached(recs)
		vs.claims = newClaimIndex()
		for name, st := range vs.held {
			vs.claims.set(name, st, true)
		}
		vs.pending = everything
		return nil
	}
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, KindPrefix(manifest.KindDeployment)), strings.HasPrefix(k, KindPrefix(manifest.KindStatefulSet)),
			strings.HasPrefix(k, KindPrefix(manifest.KindService)), strings.HasPrefix(k, KindPrefix(manifest.KindPersistentVolumeClaim)):
			vs.pending.Objects = true
		case strings.HasPrefix(k, KindPrefix(manifest.KindConfigMap)), strings.HasPrefix(k, KindPrefix(manifest.KindSecret)):
			vs.pending.Config = true
		case strings.HasPrefix(k, KindPrefix(manifest.KindIngress)):
			vs.pending.Ingresses = true
		case strings.HasPrefix(k, StatusKind+"/"):
			r, ok, err := vs.cfg.Records.Get(k)
			if err != nil {
				return failed(err)
			}
			vs.pending.Statuses = true
			old, had := vs.statuses[k]
			had = had && old.ok
			if had {
				delete(vs.held, old.status.Name)
			}
			var c cachedStatus
			if ok {
				c = vs.decodeStatus(r)
			} else {
				delete(vs.statuses, k)
			}
			if c.ok {
				vs.held[c.status.Name] = c.status
			}
			if had != c.ok || had && !SameClaim(old.status, c.status) {
				vs.pending.Claims = true
				if had {
					vs.claims.set(old.status.Name, NodeStatus{}, false)
				}
				if c.ok {
					vs.claims.set(c.status.Name, c.status, true)
				}
			}
			if had != c.ok || had && !samePlacement(old.status, c.status) {
				vs.pending.Nodes = true
			}
		}
	}
	return nil
}

// decodeStatusesCached is DecodeStatuses over the cache of decoded
// status records. Called with build held.
func (vs *Builder) decodeStatusesCached(recs []crdt.Record) map[string]NodeStatus {
	out := map[string]NodeStatus{}
	seen := map[string]bool{}
	for _, r := range recs {
		seen[r.Key] = true
		if c := vs.decodeStatus(r); c.ok {
			out[c.status.Name] = c.status
		}
	}
	for k := range vs.statuses {
		if !seen[k] {
			delete(vs.statuses, k)
		}
	}
	return out
}

// decodeStatus decodes status record r through the cache. Called with
// build held.
func (vs *Builder) decodeStatus(r crdt.Record) cachedStatus {
	c, ok := vs.statuses[r.Key]
	if ok && c.from.same(r) {
		return c
	}
	if c, ok := vs.cfg.Checked.take(r); ok {
		vs.statuses[r.Key] = c
		vs.cfg.Share.putStatus(r, c)
		return c
	}
	if c, ok := vs.cfg.Share.status(r); ok {
		vs.statuses[r.Key] = c
		return c
	}
	c = cachedStatus{from: idOf(r)}
	for _, s := range DecodeStatuses([]crdt.Record{r}, vs.cfg.ClusterCIDR) {
		c.status, c.ok = s, true
	}
	vs.statuses[r.Key] = c
	vs.cfg.Share.putStatus(r, c)
	return c
}

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

// specOf derives the replica Spec from a workload's pod template: its
// first container's fields and the pod's, and its init containers and
// other containers as Init and Containers.
func specOf(o manifest.Object) reconcile.Spec {
	t := o.PodTemplate()
	c := t.Spec.Containers[0]
	s := containerSpecOf(t, c)
	s.GracePeriod = defaultGracePeriod
	if g := t.Spec.TerminationGracePeriodSeconds; g != nil {
		s.GracePeriod = max(time.Duration(*g)*time.Second, minGracePeriod)
	}
	s.Hostname, s.Subdomain, s.DNSPolicy = t.Spec.Hostname, t.Spec.Subdomain, string(t.Spec.DNSPolicy)
	s.NoServiceLinks = t.Spec.EnableServiceLinks != nil && !*t.Spec.EnableServiceLinks
	s.SharePIDs = t.Spec.ShareProcessNamespace != nil && *t.Spec.ShareProcessNamespace
	for _, h := range t.Spec.HostAliases {
		s.HostAliases = append(s.HostAliases, reconcile.HostAlias{IP: h.IP, Hostnames: h.Hostnames})
	}
	if dc := t.Spec.DNSConfig; dc != nil {
		s.DNSConfig = &reconcile.DNSConfig{Nameservers: dc.Nameservers, Searches: dc.Searches}
		for _, o := range dc.Options {
			s.DNSConfig.Options = append(s.DNSConfig.Options, reconcile.DNSOption{Name: o.Name, Value: o.Value})
		}
	}
	for _, ps := range t.Spec.ImagePullSecrets {
		s.PullSecrets = append(s.PullSecrets, ps.Name)
	}
	if len(t.Spec.Volumes) > 0 {
		s.Volumes = volumesOf(t, s.Security.FSGroup) // volumes.go
	}
	if o.StatefulSet != nil && len(o.StatefulSet.Spec.VolumeClaimTemplates) > 0 {
		s.Volumes = append(s.Volumes, templateVolumesOf(o.StatefulSet.Spec.VolumeClaimTemplates, s.Security.FSGroup)...)
	}
	s.Labels, s.Annotations = t.Labels, t.Annotations
	for _, ic := range t.Spec.InitContainers {
		is := containerSpecOf(t, ic)
		is.Sidecar = ic.RestartPolicy != nil && *ic.RestartPolicy == corev1.ContainerRestartPolicyAlways
		s.Init = append(s.Init, is)
	}
	for _, c := range t.Spec.Containers[1:] {
		s.Containers = append(s.Containers, containerSpecOf(t, c))
	}
	return s
}

// podRequests is the effective CPU (thousandths of a core) and memory
// (bytes) request of a pod whose containers are s's, what placement
// reserves: Kubernetes' max(sum of app containers and sidecars, each
// init container with the sidecars started before it).
func podRequests(s reconcile.Spec) (milliCPU, memory int64) {
	appCPU, appMem := s.CPURequestMillis, s.MemoryRequestBytes
	for _, c := range s.Containers {
		appCPU, appMem = appCPU+c.CPURequestMillis, appMem+c.MemoryRequestBytes
	}
	// The kubelet's PodRequests (component-helpers): the sidecars started so
	// far, and each init container with them.
	var sideCPU, sideMem, initCPU, initMem int64
	for _, c := range s.Init {
		if c.Sidecar {
			sideCPU, sideMem = sideCPU+c.CPURequestMillis, sideMem+c.MemoryRequestBytes
			initCPU, initMem = max(initCPU, sideCPU), max(initMem, sideMem)
			continue
		}
		initCPU, initMem = max(initCPU, sideCPU+c.CPURequestMillis), max(initMem, sideMem+c.MemoryRequestBytes)
	}
	return max(appCPU+sideCPU, initCPU), max(appMem+sideMem, initMem)
}

// containerSpecOf is the container fields of container c of template t
// (the pod's securityContext under c's).
func containerSpecOf(t *corev1.PodTemplateSpec, c corev1.Container) reconcile.Spec {
	s := reconcile.Spec{
		Name:       c.Name,
		Image:      c.Image,
		PullPolicy: string(c.ImagePullPolicy),
		Command:    c.Command,
		Args:       c.Args,
		WorkingDir: c.WorkingDir,
	}
	s.Security = securityOf(t.Spec.SecurityContext, c.SecurityContext)
	if l := c.Lifecycle; l != nil {
		s.PostStart, s.PreStop = hookOf(c, l.PostStart), hookOf(c, l.PreStop)
	}
	s.Env, s.EnvFrom = envOf(t, c)
	if len(c.VolumeMounts) > 0 {
		s.Mounts = mountsOf(c.VolumeMounts) // volumes.go
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
		s.FSGroup = pod.FSGroup
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

// envOf is a container's env and envFrom as the replica's Spec holds
// them: the downward API fields that the template fixes
// (metadata.labels['KEY'], metadata.annotations['KEY'],
// spec.serviceAccountName) as their values, the others to fill in at
// create, ConfigMap and Secret references to resolve before it.
func envOf(t *corev1.PodTemplateSpec, c corev1.Container) ([]reconcile.EnvVar, []reconcile.EnvFrom) {
	var env []reconcile.EnvVar
	for _, e := range c.Env {
		v := reconcile.EnvVar{Name: e.Name, Value: e.Value}
		switch from := e.ValueFrom; {
		case from == nil:
		case from.FieldRef != nil:
			path := from.FieldRef.FieldPath
			if key, ok := manifest.SubscriptedField(path); ok {
				m := t.Labels
				if strings.HasPrefix(path, "metadata.annotations[") {
					m = t.Annotations
				}
				v.Value, v.Literal = m[key], true
			} else if path == "spec.serviceAccountName" {
				v.Value, v.Literal = cmp.Or(t.Spec.ServiceAccountName, t.Spec.DeprecatedServiceAccount, "default"), true
			} else {
				v.FieldPath = path
			}
		case from.ConfigMapKeyRef != nil:
			r := from.ConfigMapKeyRef
			v.ConfigMap, v.Key, v.Optional = r.Name, r.Key, r.Optional != nil && *r.Optional
		case from.SecretKeyRef != nil:
			r := from.SecretKeyRef
			v.Secret, v.Key, v.Optional = r.Name, r.Key, r.Optional != nil && *r.Optional
		case from.ResourceFieldRef != nil:
			v = resourceEnv(v, from.ResourceFieldRef, resourcesOf(t, cmp.Or(from.ResourceFieldRef.ContainerName, c.Name)))
		}
		env = append(env, v)
	}
	var envFrom []reconcile.EnvFrom
	for _, f := range c.EnvFrom {
		x := reconcile.EnvFrom{Prefix: f.Prefix}
		if f.ConfigMapRef != nil {
			x.ConfigMap, x.Optional = f.ConfigMapRef.Name, f.ConfigMapRef.Optional != nil && *f.ConfigMapRef.Optional
		} else if f.SecretRef != nil {
			x.Secret, x.Optional = f.SecretRef.Name, f.SecretRef.Optional != nil && *f.SecretRef.Optional
		}
		envFrom = append(envFrom, x)
	}
	return env, envFrom
}
