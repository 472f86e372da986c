package manifest

import (
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// KindStatefulSet is the kind of apps/v1 StatefulSets: replicas named
// NAME-0..NAME-(N-1), started in order, and at most one running copy of
// each ordinal cluster-wide (quorum self-fencing, see node); each
// ordinal mounts its own claims made from the volumeClaimTemplates.
const KindStatefulSet = "StatefulSet"

// statefulSetFields are the StatefulSet fields Starling implements; see
// deploymentFields. updateStrategy.rollingUpdate (partition,
// maxUnavailable) is refused.
var statefulSetFields = newFieldTree(
	commonFields,
	serverOwnedMeta,
	[]string{
		"spec.replicas", "spec.selector.matchLabels", "spec.serviceName",
		"spec.podManagementPolicy", "spec.updateStrategy.type",
		"spec.revisionHistoryLimit", "spec.minReadySeconds",
		"spec.persistentVolumeClaimRetentionPolicy.whenDeleted", "spec.persistentVolumeClaimRetentionPolicy.whenScaled",
	},
	prefixed("spec.volumeClaimTemplates[].", "apiVersion", "kind", "metadata.name", "metadata.labels", "metadata.annotations",
		"metadata.creationTimestamp", "status", "spec.accessModes", "spec.resources.requests.storage", "spec.storageClassName", "spec.volumeMode"),
	podTemplateFields,
)

// fromStatefulSet defaults s in place, clears server-owned fields and wraps it.
func fromStatefulSet(s *appsv1.StatefulSet) Object {
	defaultStatefulSet(s)
	return Object{Kind: KindStatefulSet, Namespace: s.Namespace, Name: s.Name, StatefulSet: s}
}

func defaultStatefulSet(s *appsv1.StatefulSet) {
	s.APIVersion, s.Kind = "apps/v1", KindStatefulSet
	clearMeta(&s.ObjectMeta)
	s.Status = appsv1.StatefulSetStatus{}
	sp := &s.Spec
	if sp.Replicas == nil {
		sp.Replicas = ptr[int32](defaultReplicas)
	}
	if sp.PodManagementPolicy == "" {
		sp.PodManagementPolicy = appsv1.OrderedReadyPodManagement
	}
	if sp.UpdateStrategy.Type == "" {
		sp.UpdateStrategy.Type = appsv1.RollingUpdateStatefulSetStrategyType
	}
	if sp.RevisionHistoryLimit == nil {
		sp.RevisionHistoryLimit = ptr[int32](defaultRevisionHistoryLimit)
	}
	sp.Template.CreationTimestamp = metav1.Time{}
	defaultPodSpec(&sp.Template.Spec)
	for i := range sp.VolumeClaimTemplates {
		c := &sp.VolumeClaimTemplates[i]
		c.CreationTimestamp, c.Status = metav1.Time{}, corev1.PersistentVolumeClaimStatus{}
		defaultClaimSpec(&c.Spec)
	}
	if len(sp.VolumeClaimTemplates) > 0 && sp.PersistentVolumeClaimRetentionPolicy == nil {
		sp.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{}
	}
	if rp := sp.PersistentVolumeClaimRetentionPolicy; rp != nil {
		if rp.WhenDeleted == "" {
			rp.WhenDeleted = appsv1.RetainPersistentVolumeClaimRetentionPolicyType
		}
		if rp.WhenScaled == "" {
			rp.WhenScaled = appsv1.RetainPersistentVolumeClaimRetentionPolicyType
		}
	}
}

// validateStatefulSetSpec follows Kubernetes' ValidateStatefulSetSpec for
// the supported subset.
func validateStatefulSetSpec(s *appsv1.StatefulSetSpec, p *field.Path) field.ErrorList {
	errs := validateWorkloadSpec(s.Replicas, s.Selector, &s.Template, p)
	switch s.PodManagementPolicy {
	case appsv1.OrderedReadyPodManagement, appsv1.ParallelPodManagement:
	default:
		errs = append(errs, field.NotSupported(p.Child("podManagementPolicy"), s.PodManagementPolicy,
			[]appsv1.PodManagementPolicyType{appsv1.OrderedReadyPodManagement, appsv1.ParallelPodManagement}))
	}
	if s.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType {
		errs = append(errs, field.NotSupported(p.Child("updateStrategy", "type"), s.UpdateStrategy.Type,
			[]appsv1.StatefulSetUpdateStrategyType{appsv1.RollingUpdateStatefulSetStrategyType}))
	}
	errs = append(errs, nonNegative(int64(s.MinReadySeconds), p.Child("minReadySeconds"))...)
	if s.RevisionHistoryLimit != nil {
		errs = append(errs, nonNegative(int64(*s.RevisionHistoryLimit), p.Child("revisionHistoryLimit"))...)
	}
	if s.ServiceName != "" {
		for _, msg := range apivalidation.NameIsDNS1035Label(s.ServiceName, false) {
			errs = append(errs, field.Invalid(p.Child("serviceName"), s.ServiceName, msg))
		}
	}
	// The pod mounts a template by its name, as a volume it does not
	// list: validated as a claim volume.
	pod := s.Template.Spec.DeepCopy()
	for i, c := range s.VolumeClaimTemplates {
		cp := p.Child("volumeClaimTemplates").Index(i)
		for _, msg := range apivalidation.NameIsDNSSubdomain(c.Name, false) {
			errs = append(errs, field.Invalid(cp.Child("metadata", "name"), c.Name, msg))
		}
		if slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == c.Name }) {
			errs = append(errs, field.Duplicate(cp.Child("metadata", "name"), c.Name))
			continue
		}
		errs = append(errs, validateClaimSpec(&c.Spec, cp.Child("spec"))...)
		pod.Volumes = append(pod.Volumes, corev1.Volume{Name: c.Name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.Name}}})
	}
	if rp := s.PersistentVolumeClaimRetentionPolicy; rp != nil {
		policies := []appsv1.PersistentVolumeClaimRetentionPolicyType{appsv1.RetainPersistentVolumeClaimRetentionPolicyType, appsv1.DeletePersistentVolumeClaimRetentionPolicyType}
		rpp := p.Child("persistentVolumeClaimRetentionPolicy")
		if !slices.Contains(policies, rp.WhenDeleted) {
			errs = append(errs, field.NotSupported(rpp.Child("whenDeleted"), rp.WhenDeleted, policies))
		}
		if !slices.Contains(policies, rp.WhenScaled) {
			errs = append(errs, field.NotSupported(rpp.Child("whenScaled"), rp.WhenScaled, policies))
		}
	}
	return append(errs, validatePodSpec(pod, p.Child("template", "spec"))...)
}

// PodTemplate returns the pod template of a Deployment or StatefulSet,
// nil for other kinds.
func (o Object) PodTemplate() *corev1.PodTemplateSpec {
	switch {
	case o.Deployment != nil:
		return &o.Deployment.Spec.Template
	case o.StatefulSet != nil:
		return &o.StatefulSet.Spec.Template
	}
	return nil
}

// Replicas returns spec.replicas of a Deployment or StatefulSet (1 when
// unset), 0 for other kinds.
func (o Object) Replicas() int {
	var r *int32
	switch {
	case o.Deployment != nil:
		r = o.Deployment.Spec.Replicas
	case o.StatefulSet != nil:
		r = o.StatefulSet.Spec.Replicas
	default:
		return 0
	}
	if r == nil {
		return 1
	}
	return int(*r)
}

// IsWorkload reports whether o runs replicas (Deployment or StatefulSet).
func (o Object) IsWorkload() bool { return o.Deployment != nil || o.StatefulSet != nil }
