package view

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

// volumesOf is a pod template's volumes as a replica's Spec holds them
// (manifest validation admits only the kinds handled here).
func volumesOf(t *corev1.PodTemplateSpec, fsGroup *int64) []reconcile.Volume {
	var out []reconcile.Volume
	for _, v := range t.Spec.Volumes {
		rv := reconcile.Volume{Name: v.Name}
		if v.HostPath == nil {
			rv.Group = fsGroup // the kubelet leaves a hostPath's owner alone
		}
		switch src := v.VolumeSource; {
		case src.EmptyDir != nil:
			rv.EmptyDir, rv.Memory = true, src.EmptyDir.Medium == corev1.StorageMediumMemory
			if q := src.EmptyDir.SizeLimit; q != nil {
				rv.SizeLimit = q.Value()
			}
		case src.PersistentVolumeClaim != nil:
			rv.Claim = src.PersistentVolumeClaim.ClaimName
			rv.ClaimReadOnly = src.PersistentVolumeClaim.ReadOnly
		case src.HostPath != nil:
			rv.HostPath = src.HostPath.Path
			rv.HostPathCreate = src.HostPath.Type != nil && *src.HostPath.Type == corev1.HostPathDirectoryOrCreate
		case src.ConfigMap != nil:
			rv.DefaultMode = mode(src.ConfigMap.DefaultMode)
			rv.Sources = []reconcile.FileSource{{ConfigMap: src.ConfigMap.Name, Optional: isTrue(src.ConfigMap.Optional), Items: itemsOf(src.ConfigMap.Items)}}
		case src.Secret != nil:
			rv.DefaultMode = mode(src.Secret.DefaultMode)
			rv.Sources = []reconcile.FileSource{{Secret: src.Secret.SecretName, Optional: isTrue(src.Secret.Optional), Items: itemsOf(src.Secret.Items)}}
		case src.DownwardAPI != nil:
			rv.DefaultMode = mode(src.DownwardAPI.DefaultMode)
			rv.Sources = []reconcile.FileSource{{Fields: fieldsOf(t, src.DownwardAPI.Items)}}
		case src.Projected != nil:
			rv.DefaultMode = mode(src.Projected.DefaultMode)
			for _, ps := range src.Projected.Sources {
				switch {
				case ps.ConfigMap != nil:
					rv.Sources = append(rv.Sources, reconcile.FileSource{ConfigMap: ps.ConfigMap.Name, Optional: isTrue(ps.ConfigMap.Optional), Items: itemsOf(ps.ConfigMap.Items)})
				case ps.Secret != nil:
					rv.Sources = append(rv.Sources, reconcile.FileSource{Secret: ps.Secret.Name, Optional: isTrue(ps.Secret.Optional), Items: itemsOf(ps.Secret.Items)})
				case ps.DownwardAPI != nil:
					rv.Sources = append(rv.Sources, reconcile.FileSource{Fields: fieldsOf(t, ps.DownwardAPI.Items)})
				}
			}
		}
		out = append(out, rv)
	}
	return out
}

// templateVolumesOf are the volumes a StatefulSet's pods mount by the
// names of its volumeClaimTemplates: each ordinal its own claim.
func templateVolumesOf(tpls []corev1.PersistentVolumeClaim, fsGroup *int64) []reconcile.Volume {
	var out []reconcile.Volume
	for _, c := range tpls {
		out = append(out, reconcile.Volume{Name: c.Name, Claim: c.Name, ClaimTemplate: true, Group: fsGroup})
	}
	return out
}

// resourceEnv is env var v from resourceFieldRef r of a container with
// resources res, as the kubelet fills it in: the quantity divided by the
// divisor (default 1), rounded up; a request the container does not set
// is its limit (the API server's default) or 0; a limit it does not set
// is the node's allocatable, left to the node that starts the replica
// (reconcile.EnvVar.Resource).
func resourceEnv(v reconcile.EnvVar, r *corev1.ResourceFieldSelector, res corev1.ResourceRequirements) reconcile.EnvVar {
	kind, name, _ := strings.Cut(r.Resource, ".")
	divisor := r.Divisor.MilliValue()
	if r.Divisor.IsZero() {
		divisor = 1000
	}
	q, ok := res.Limits[corev1.ResourceName(name)]
	if kind == "requests" {
		if req, set := res.Requests[corev1.ResourceName(name)]; set {
			q, ok = req, true
		}
		if !ok {
			v.Value, v.Literal = "0", true
			return v
		}
	}
	if !ok {
		v.Resource, v.DivisorMilli = r.Resource, divisor
		return v
	}
	v.Value, v.Literal = reconcile.ResourceValue(q.MilliValue(), divisor), true
	return v
}

func mountsOf(ms []corev1.VolumeMount) []reconcile.Mount {
	var out []reconcile.Mount
	for _, m := range ms {
		out = append(out, reconcile.Mount{Volume: m.Name, Path: m.MountPath, SubPath: m.SubPath, SubPathExpr: m.SubPathExpr, ReadOnly: m.ReadOnly})
	}
	return out
}

func itemsOf(items []corev1.KeyToPath) []reconcile.KeyToPath {
	var out []reconcile.KeyToPath
	for _, it := range items {
		out = append(out, reconcile.KeyToPath{Key: it.Key, Path: it.Path, Mode: mode(it.Mode)})
	}
	return out
}

// fieldsOf are the files of a downwardAPI source of template t: a
// field of the pod, or a resource of one of its containers (its value
// now, or, for a limit the container does not set, the node's
// allocatable, filled in by the node; see resourceEnv).
func fieldsOf(t *corev1.PodTemplateSpec, items []corev1.DownwardAPIVolumeFile) []reconcile.FieldFile {
	var out []reconcile.FieldFile
	for _, it := range items {
		f := reconcile.FieldFile{Path: it.Path, Mode: mode(it.Mode)}
		switch {
		case it.FieldRef != nil:
			f.FieldPath = it.FieldRef.FieldPath
		case it.ResourceFieldRef != nil:
			v := resourceEnv(reconcile.EnvVar{}, it.ResourceFieldRef, resourcesOf(t, it.ResourceFieldRef.ContainerName))
			f.Value, f.Resource, f.DivisorMilli = v.Value, v.Resource, v.DivisorMilli
		default:
			continue
		}
		out = append(out, f)
	}
	return out
}

// resourcesOf are the resources of container name of template t (an
// app or an init container; none when there is no such container).
func resourcesOf(t *corev1.PodTemplateSpec, name string) corev1.ResourceRequirements {
	for _, c := range slices.Concat(t.Spec.Containers, t.Spec.InitContainers) {
		if c.Name == name {
			return c.Resources
		}
	}
	return corev1.ResourceRequirements{}
}

// mode is a manifest's file mode (nil: 0, the default).
func mode(m *int32) uint32 {
	if m == nil || *m < 0 {
		return 0
	}
	return uint32(*m)
}

func isTrue(b *bool) bool { return b != nil && *b }
