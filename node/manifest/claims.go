package manifest

import (
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// KindPersistentVolumeClaim is the kind of v1 PersistentVolumeClaims:
// data pinned to the node that first runs a replica using the claim, as
// Kubernetes' local volumes (and k3s' local-path provisioner) give it.
const KindPersistentVolumeClaim = "PersistentVolumeClaim"

// StorageClassLocal is the one storage class: a directory on the node
// that binds the claim, under the agent's data directory. A claim that
// names no class gets it, as a default class is given.
const StorageClassLocal = "local"

// ReleasedAnnotation on a claim names the binding its data was given up
// from ("NODE" as "starling volume release" sets it): the view no longer
// counts that binding, and the next replica starts empty elsewhere.
const ReleasedAnnotation = "starling.dev/released-from"

// DeletionRequestedAnnotation on a claim holds when (RFC 3339) a delete
// of it was asked while replicas mounted it: Kubernetes' protection
// finalizer (kubernetes.io/pvc-protection). No replica starts on it any
// more, and the node that holds its data deletes it once none mounts it.
const DeletionRequestedAnnotation = "starling.dev/deletion-requested"

// Annotations a claim is served with (the view fills them in): where its volume
// is, as Kubernetes' scheduler marks a claim bound on a node
// (SelectedNodeAnnotation), and what Starling adds.
const (
	SelectedNodeAnnotation = "volume.kubernetes.io/selected-node"
	// VolumeDirAnnotation is the volume's directory under the node's
	// --data-dir; UsedAnnotation what it holds, in bytes, as last
	// measured; SizeLimitAnnotation "enforced" (a project quota) or
	// "advisory".
	VolumeDirAnnotation = "starling.dev/volume-dir"
	UsedAnnotation      = "starling.dev/used-bytes"
	SizeLimitAnnotation = "starling.dev/size-limit"
)

var claimFields = newFieldTree(commonFields, serverOwnedMeta, []string{
	"spec.accessModes", "spec.resources.requests.storage", "spec.storageClassName", "spec.volumeMode",
})

// claimAccessModes are the access modes a volume on one node can give.
var claimAccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteOncePod}

// fromClaim defaults c in place as the API server and a default storage
// class do (class local, volume mode Filesystem), clears server-owned
// fields and wraps it.
func fromClaim(c *corev1.PersistentVolumeClaim) Object {
	c.APIVersion, c.Kind = "v1", KindPersistentVolumeClaim
	clearMeta(&c.ObjectMeta)
	c.Status = corev1.PersistentVolumeClaimStatus{}
	defaultClaimSpec(&c.Spec)
	return Object{Kind: KindPersistentVolumeClaim, Namespace: c.Namespace, Name: c.Name, Claim: c}
}

// defaultClaimSpec defaults a claim's spec (a claim's, or a
// volumeClaimTemplate's) as the default storage class and the API server
// do: class local, volume mode Filesystem.
func defaultClaimSpec(s *corev1.PersistentVolumeClaimSpec) {
	if s.StorageClassName == nil {
		s.StorageClassName = ptr(StorageClassLocal)
	}
	if s.VolumeMode == nil {
		s.VolumeMode = ptr(corev1.PersistentVolumeFilesystem)
	}
}

// validateClaim follows Kubernetes' ValidatePersistentVolumeClaim for
// what a local volume can be: ReadWriteOnce or ReadWriteOncePod, a
// storage request, class local, a filesystem.
func validateClaim(c *corev1.PersistentVolumeClaim) field.ErrorList {
	errs := validateMeta(&c.ObjectMeta, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))
	return append(append(errs, validateClaimSpec(&c.Spec, field.NewPath("spec"))...), unsupportedFields(claimFields, c)...)
}

// validateClaimSpec checks a claim's spec (a claim's, or a StatefulSet's
// volumeClaimTemplates').
func validateClaimSpec(s *corev1.PersistentVolumeClaimSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(s.AccessModes) == 0 {
		errs = append(errs, field.Required(p.Child("accessModes"), "at least 1 access mode is required: ReadWriteOnce"))
	}
	for i, m := range s.AccessModes {
		if !slices.Contains(claimAccessModes, m) {
			errs = append(errs, field.NotSupported(p.Child("accessModes").Index(i), m, claimAccessModes))
		}
	}
	storage, ok := s.Resources.Requests[corev1.ResourceStorage]
	switch {
	case !ok:
		errs = append(errs, field.Required(p.Child("resources", "requests", "storage"), "a size, e.g. 1Gi"))
	case storage.Sign() <= 0:
		errs = append(errs, field.Invalid(p.Child("resources", "requests", "storage"), storage.String(), "must be greater than zero"))
	}
	if s.StorageClassName != nil && *s.StorageClassName != StorageClassLocal {
		errs = append(errs, field.NotSupported(p.Child("storageClassName"), *s.StorageClassName, []string{StorageClassLocal}))
	}
	if s.VolumeMode != nil && *s.VolumeMode != corev1.PersistentVolumeFilesystem {
		errs = append(errs, field.NotSupported(p.Child("volumeMode"), *s.VolumeMode, []corev1.PersistentVolumeMode{corev1.PersistentVolumeFilesystem}))
	}
	return errs
}

// validateClaimUpdate is what Kubernetes refuses in replacing a claim:
// its spec is immutable but for a larger storage request.
func validateClaimUpdate(prev, obj *corev1.PersistentVolumeClaim) field.ErrorList {
	a, b := prev.Spec.DeepCopy(), obj.Spec.DeepCopy()
	a.Resources, b.Resources = corev1.VolumeResourceRequirements{}, corev1.VolumeResourceRequirements{}
	var errs field.ErrorList
	if !apiequality.Semantic.DeepEqual(a, b) {
		errs = append(errs, field.Forbidden(field.NewPath("spec"), "spec is immutable after creation except resources.requests: delete and create the claim to change it"))
	}
	was, now := prev.Spec.Resources.Requests[corev1.ResourceStorage], obj.Spec.Resources.Requests[corev1.ResourceStorage]
	if now.Cmp(was) < 0 {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "resources", "requests", "storage"), fmt.Sprintf("field can not be less than previous value %s", was.String())))
	}
	return errs
}

// ClaimsOf returns the names of the PersistentVolumeClaims a pod spec
// mounts through its volumes of the field "persistentVolumeClaim", in
// volume order.
func ClaimsOf(s *corev1.PodSpec) []string {
	var out []string
	for _, v := range s.Volumes {
		if v.PersistentVolumeClaim != nil {
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		}
	}
	return out
}

// validateClaimStrategy refuses a rolling update of a Deployment that
// mounts a claim: its data is ReadWriteOnce, on one node, and a rolling
// update would run the new replica beside the old one on it.
func validateClaimStrategy(d *appsv1.Deployment) field.ErrorList {
	claims := ClaimsOf(&d.Spec.Template.Spec)
	if len(claims) == 0 || d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType {
		return nil
	}
	return field.ErrorList{field.Invalid(field.NewPath("spec", "strategy", "type"), d.Spec.Strategy.Type,
		fmt.Sprintf("the pods mount PersistentVolumeClaim %q (ReadWriteOnce, on one node): set strategy type Recreate, so the old replica stops before the new one starts", claims[0]))}
}
