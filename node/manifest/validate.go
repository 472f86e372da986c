package manifest

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/distribution/reference"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MaxDeploymentNameLength bounds Deployment names: replica names are
// derived from them (with the 8-character SpecHash and a suffix appended)
// and must still fit in a DNS label (63 characters).
const MaxDeploymentNameLength = 40

// Kubernetes' default --service-node-port-range.
const (
	NodePortMin = 30000
	NodePortMax = 32767
)

// EnvFieldPaths are the downward API fields an env var's
// valueFrom.fieldRef may name (Kubernetes' names; the values are filled in
// when the container is created), besides metadata.labels['KEY'] and
// metadata.annotations['KEY'].
var EnvFieldPaths = []string{"metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
	"status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"}

// Validate returns every problem of o, which must already be defaulted (as
// Parse and Decode return it), as Kubernetes field errors. Fields Starling
// does not implement are reported as
// `<path>: Forbidden: not supported by Starling yet`.
func Validate(o Object) field.ErrorList {
	switch o.Kind {
	case KindDeployment:
		if o.Deployment == nil {
			return field.ErrorList{field.Required(field.NewPath("spec"), "Object.Deployment is nil")}
		}
		d := o.Deployment
		errs := validateMeta(&d.ObjectMeta, deploymentName, field.NewPath("metadata"))
		errs = append(errs, validateIdentity(o, &d.ObjectMeta)...)
		errs = append(errs, validateDeploymentSpec(&d.Spec, field.NewPath("spec"))...)
		errs = append(errs, validateClaimStrategy(d)...)
		return append(errs, unsupportedFields(deploymentFields, d)...)
	case KindStatefulSet:
		if o.StatefulSet == nil {
			return field.ErrorList{field.Required(field.NewPath("spec"), "Object.StatefulSet is nil")}
		}
		st := o.StatefulSet
		errs := validateMeta(&st.ObjectMeta, deploymentName, field.NewPath("metadata"))
		errs = append(errs, validateIdentity(o, &st.ObjectMeta)...)
		errs = append(errs, validateStatefulSetSpec(&st.Spec, field.NewPath("spec"))...)
		return append(errs, unsupportedFields(statefulSetFields, st)...)
	case KindService:
		if o.Service == nil {
			return field.ErrorList{field.Required(field.NewPath("spec"), "Object.Service is nil")}
		}
		s := o.Service
		errs := validateMeta(&s.ObjectMeta, apivalidation.NameIsDNS1035Label, field.NewPath("metadata"))
		errs = append(errs, validateIdentity(o, &s.ObjectMeta)...)
		errs = append(errs, validateServiceSpec(&s.Spec, field.NewPath("spec"))...)
		return append(errs, unsupportedFields(serviceFields, s)...)
	case KindConfigMap:
		if o.ConfigMap == nil {
			return field.ErrorList{field.Required(field.NewPath("data"), "Object.ConfigMap is nil")}
		}
		return append(validateConfigMap(o.ConfigMap), validateIdentity(o, &o.ConfigMap.ObjectMeta)...)
	case KindSecret:
		if o.Secret == nil {
			return field.ErrorList{field.Required(field.NewPath("data"), "Object.Secret is nil")}
		}
		return append(validateSecret(o.Secret), validateIdentity(o, &o.Secret.ObjectMeta)...)
	case KindPersistentVolumeClaim:
		if o.Claim == nil {
			return field.ErrorList{field.Required(field.NewPath("spec"), "Object.Claim is nil")}
		}
		return append(validateClaim(o.Claim), validateIdentity(o, &o.Claim.ObjectMeta)...)
	case KindIngress:
		if o.Ingress == nil {
			return field.ErrorList{field.Required(field.NewPath("spec"), "Object.Ingress is nil")}
		}
		return append(validateIngress(o.Ingress), validateIdentity(o, &o.Ingress.ObjectMeta)...)
	default:
		return field.ErrorList{field.NotSupported(field.NewPath("kind"), o.Kind, []string{KindDeployment, KindStatefulSet, KindService, KindConfigMap, KindSecret, KindPersistentVolumeClaim, KindIngress})}
	}
}

// validateIdentity checks that the Object's key fields agree with the
// object they describe (they can only disagree when built by hand).
func validateIdentity(o Object, m *metav1.ObjectMeta) field.ErrorList {
	var errs field.ErrorList
	if o.Name != m.Name {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), m.Name, fmt.Sprintf("must equal Object.Name %q", o.Name)))
	}
	if o.Namespace != m.Namespace {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "namespace"), m.Namespace, fmt.Sprintf("must equal Object.Namespace %q", o.Namespace)))
	}
	return errs
}

// deploymentName is a DNS-1123 subdomain of at most MaxDeploymentNameLength
// characters.
func deploymentName(name string, prefix bool) []string {
	msgs := apivalidation.NameIsDNSSubdomain(name, prefix)
	if len(name) > MaxDeploymentNameLength {
		msgs = append(msgs, fmt.Sprintf("must be no more than %d characters because replica names are derived from it", MaxDeploymentNameLength))
	}
	return msgs
}

func validateMeta(m *metav1.ObjectMeta, nameFn apivalidation.ValidateNameFunc, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if m.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), "name is required"))
	} else {
		for _, msg := range nameFn(m.Name, false) {
			errs = append(errs, field.Invalid(p.Child("name"), m.Name, msg))
		}
	}
	if m.Namespace == "" {
		errs = append(errs, field.Required(p.Child("namespace"), ""))
	} else {
		for _, msg := range apivalidation.ValidateNamespaceName(m.Namespace, false) {
			errs = append(errs, field.Invalid(p.Child("namespace"), m.Namespace, msg))
		}
	}
	errs = append(errs, validateLabels(m.Labels, p.Child("labels"))...)
	return append(errs, validateAnnotations(m.Annotations, p.Child("annotations"))...)
}

// validateLabels is metavalidation.ValidateLabels in key order, so messages
// come out the same on every run.
func validateLabels(labels map[string]string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		errs = append(errs, metavalidation.ValidateLabels(map[string]string{k: labels[k]}, p)...)
	}
	return errs
}

// validateAnnotations is apivalidation.ValidateAnnotations in key order.
func validateAnnotations(annotations map[string]string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		errs = append(errs, apivalidation.ValidateAnnotations(map[string]string{k: ""}, p)...)
	}
	if apivalidation.ValidateAnnotationsSize(annotations) != nil {
		errs = append(errs, field.TooLong(p, "", apivalidation.TotalAnnotationSizeLimitB))
	}
	return errs
}

func nonNegative(v int64, p *field.Path) field.ErrorList {
	return apivalidation.ValidateNonnegativeField(v, p)
}

// validateWorkloadSpec checks what Deployments and StatefulSets share:
// replicas, a selector matching the template labels, template metadata.
// The pod spec is checked by the caller.
func validateWorkloadSpec(replicas *int32, selector *metav1.LabelSelector, template *corev1.PodTemplateSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	s := struct {
		Replicas *int32
		Selector *metav1.LabelSelector
		Template *corev1.PodTemplateSpec
	}{replicas, selector, template}
	if s.Replicas == nil {
		errs = append(errs, field.Required(p.Child("replicas"), ""))
	} else {
		errs = append(errs, nonNegative(int64(*s.Replicas), p.Child("replicas"))...)
		if *s.Replicas > MaxReplicas {
			errs = append(errs, field.Invalid(p.Child("replicas"), *s.Replicas, fmt.Sprintf("must be at most %d", MaxReplicas)))
		}
	}

	templateLabels := p.Child("template", "metadata", "labels")
	switch {
	case s.Selector == nil:
		errs = append(errs, field.Required(p.Child("selector"), ""))
	case len(s.Selector.MatchLabels) == 0:
		errs = append(errs, field.Required(p.Child("selector", "matchLabels"), ""))
	default:
		errs = append(errs, validateLabels(s.Selector.MatchLabels, p.Child("selector", "matchLabels"))...)
		for k, v := range s.Selector.MatchLabels {
			if got, ok := s.Template.Labels[k]; !ok || got != v {
				errs = append(errs, field.Invalid(templateLabels, s.Template.Labels, "`selector` does not match template `labels`"))
				break
			}
		}
	}
	errs = append(errs, validateLabels(s.Template.Labels, templateLabels)...)
	errs = append(errs, validateAnnotations(s.Template.Annotations, p.Child("template", "metadata", "annotations"))...)

	return errs
}

// validateDeploymentSpec follows Kubernetes' ValidateDeploymentSpec
// (k8s.io/kubernetes/pkg/apis/apps/validation) for the supported subset.
func validateDeploymentSpec(s *appsv1.DeploymentSpec, p *field.Path) field.ErrorList {
	errs := validateWorkloadSpec(s.Replicas, s.Selector, &s.Template, p)
	errs = append(errs, validateStrategy(&s.Strategy, p.Child("strategy"))...)
	errs = append(errs, nonNegative(int64(s.MinReadySeconds), p.Child("minReadySeconds"))...)
	if s.RevisionHistoryLimit != nil {
		errs = append(errs, nonNegative(int64(*s.RevisionHistoryLimit), p.Child("revisionHistoryLimit"))...)
	}
	if s.ProgressDeadlineSeconds != nil {
		pds := *s.ProgressDeadlineSeconds
		errs = append(errs, nonNegative(int64(pds), p.Child("progressDeadlineSeconds"))...)
		if pds <= s.MinReadySeconds {
			errs = append(errs, field.Invalid(p.Child("progressDeadlineSeconds"), pds, "must be greater than minReadySeconds"))
		}
	}
	return append(errs, validatePodSpec(&s.Template.Spec, p.Child("template", "spec"))...)
}

func validateStrategy(s *appsv1.DeploymentStrategy, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch s.Type {
	case appsv1.RecreateDeploymentStrategyType:
		if s.RollingUpdate != nil {
			errs = append(errs, field.Forbidden(p.Child("rollingUpdate"), "may not be specified when strategy `type` is 'Recreate'"))
		}
	case appsv1.RollingUpdateDeploymentStrategyType:
		ru := s.RollingUpdate
		if ru == nil || ru.MaxUnavailable == nil || ru.MaxSurge == nil {
			// Defaulting fills these in.
			errs = append(errs, field.Required(p.Child("rollingUpdate"), "this should be defaulted and never be nil"))
			break
		}
		rp := p.Child("rollingUpdate")
		errs = append(errs, validateIntOrPercent(*ru.MaxUnavailable, rp.Child("maxUnavailable"))...)
		errs = append(errs, validateIntOrPercent(*ru.MaxSurge, rp.Child("maxSurge"))...)
		if intOrPercentValue(*ru.MaxUnavailable) == 0 && intOrPercentValue(*ru.MaxSurge) == 0 {
			errs = append(errs, field.Invalid(rp.Child("maxUnavailable"), *ru.MaxUnavailable, "may not be 0 when `maxSurge` is 0"))
		}
		if v, ok := percentValue(*ru.MaxUnavailable); ok && v > 100 {
			errs = append(errs, field.Invalid(rp.Child("maxUnavailable"), *ru.MaxUnavailable, "must not be greater than 100%"))
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("type"), s.Type, []appsv1.DeploymentStrategyType{
			appsv1.RecreateDeploymentStrategyType, appsv1.RollingUpdateDeploymentStrategyType,
		}))
	}
	return errs
}

// validateIntOrPercent accepts a non-negative integer or "N%".
func validateIntOrPercent(v intstr.IntOrString, p *field.Path) field.ErrorList {
	switch v.Type {
	case intstr.String:
		var errs field.ErrorList
		for _, msg := range validation.IsValidPercent(v.StrVal) {
			errs = append(errs, field.Invalid(p, v, msg))
		}
		return errs
	case intstr.Int:
		return nonNegative(int64(v.IntVal), p)
	default:
		return field.ErrorList{field.Invalid(p, v, "must be an integer or percentage (e.g '5%')")}
	}
}

// percentValue returns N of a valid "N%" string; values too large for an int
// read as math.MaxInt.
func percentValue(v intstr.IntOrString) (int, bool) {
	if v.Type != intstr.String || len(validation.IsValidPercent(v.StrVal)) != 0 {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSuffix(v.StrVal, "%"))
	if err != nil {
		return math.MaxInt, true
	}
	return n, true
}

func intOrPercentValue(v intstr.IntOrString) int {
	if n, ok := percentValue(v); ok {
		return n
	}
	if v.Type == intstr.Int {
		return int(v.IntVal)
	}
	return -1 // invalid, reported by validateIntOrPercent
}

// MaxContainers bounds a pod's containers, init containers included
// (api.MaxContainers: what a node may report of one replica).
const MaxContainers = 64

func validatePodSpec(s *corev1.PodSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	cp := p.Child("containers")
	if len(s.Containers) == 0 {
		errs = append(errs, field.Required(cp, ""))
	}
	if n := len(s.Containers) + len(s.InitContainers); n > MaxContainers {
		errs = append(errs, field.TooMany(cp, n, MaxContainers))
	}
	grace := int64(defaultGracePeriodSeconds)
	if s.TerminationGracePeriodSeconds != nil {
		grace = *s.TerminationGracePeriodSeconds
	}
	names := map[string]bool{}
	for i := range s.InitContainers {
		errs = append(errs, validateInitContainer(&s.InitContainers[i], grace, names, p.Child("initContainers").Index(i))...)
	}
	for i := range s.Containers {
		errs = append(errs, uniqueName(s.Containers[i].Name, names, cp.Index(i))...)
		errs = append(errs, validateContainer(&s.Containers[i], cp.Index(i))...)
		errs = append(errs, validateLifecycle(&s.Containers[i], grace, cp.Index(i).Child("lifecycle"))...)
	}
	if s.RestartPolicy != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(p.Child("restartPolicy"), s.RestartPolicy, []corev1.RestartPolicy{corev1.RestartPolicyAlways}))
	}
	if s.TerminationGracePeriodSeconds != nil {
		errs = append(errs, nonNegative(*s.TerminationGracePeriodSeconds, p.Child("terminationGracePeriodSeconds"))...)
	}
	errs = append(errs, validateLabels(s.NodeSelector, p.Child("nodeSelector"))...)
	for i, ps := range s.ImagePullSecrets {
		for _, msg := range validation.IsDNS1123Subdomain(ps.Name) {
			errs = append(errs, field.Invalid(p.Child("imagePullSecrets").Index(i).Child("name"), ps.Name, msg))
		}
	}
	switch s.DNSPolicy {
	case "", corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet, corev1.DNSDefault, corev1.DNSNone:
	default:
		errs = append(errs, field.NotSupported(p.Child("dnsPolicy"), s.DNSPolicy, []corev1.DNSPolicy{
			corev1.DNSClusterFirstWithHostNet, corev1.DNSClusterFirst, corev1.DNSDefault, corev1.DNSNone,
		}))
	}
	errs = append(errs, validatePodDNS(s, p)...)
	errs = append(errs, resourceRefContainers(s, p)...) // config.go
	mounts := func(c corev1.Container) bool { return len(c.VolumeMounts) > 0 }
	if len(s.Volumes) > 0 || slices.ContainsFunc(s.Containers, mounts) || slices.ContainsFunc(s.InitContainers, mounts) {
		errs = append(errs, validateVolumes(s, p)...) // volumes.go
	}
	if sc := s.SecurityContext; sc != nil {
		sp := p.Child("securityContext")
		errs = append(errs, validateIDs(sc.RunAsUser, sc.RunAsGroup, sp)...)
		if sc.FSGroup != nil && (*sc.FSGroup < 0 || *sc.FSGroup > math.MaxInt32) {
			errs = append(errs, field.Invalid(sp.Child("fsGroup"), *sc.FSGroup, "must be between 0 and 2147483647, inclusive"))
		}
		if p := sc.FSGroupChangePolicy; p != nil && *p != corev1.FSGroupChangeAlways && *p != corev1.FSGroupChangeOnRootMismatch {
			errs = append(errs, field.NotSupported(sp.Child("fsGroupChangePolicy"), *p, []corev1.PodFSGroupChangePolicy{corev1.FSGroupChangeOnRootMismatch, corev1.FSGroupChangeAlways}))
		}
		errs = append(errs, validateSeccomp(sc.SeccompProfile, sp.Child("seccompProfile"))...)
	}
	return errs
}

// validateInitContainer checks init container c: a container whose
// restartPolicy is unset (it runs to completion, so it has no probes and
// no lifecycle hooks, as in Kubernetes) or Always (a native sidecar,
// which may have both), named apart from the pod's other containers
// (names).
func validateInitContainer(c *corev1.Container, grace int64, names map[string]bool, p *field.Path) field.ErrorList {
	errs := uniqueName(c.Name, names, p)
	errs = append(errs, validateContainer(c, p)...)
	sidecar := c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
	if c.RestartPolicy != nil && !sidecar {
		errs = append(errs, field.NotSupported(p.Child("restartPolicy"), *c.RestartPolicy, []corev1.ContainerRestartPolicy{corev1.ContainerRestartPolicyAlways}))
	}
	if sidecar {
		return append(errs, validateLifecycle(c, grace, p.Child("lifecycle"))...)
	}
	for name, set := range map[string]bool{"readinessProbe": c.ReadinessProbe != nil, "livenessProbe": c.LivenessProbe != nil, "startupProbe": c.StartupProbe != nil, "lifecycle": c.Lifecycle != nil} {
		if set {
			errs = append(errs, field.Forbidden(p.Child(name), "may not be set for init containers without restartPolicy Always"))
		}
	}
	return errs
}

// uniqueName refuses a container name that names another container of
// the pod (names holds those seen, name is added).
func uniqueName(name string, names map[string]bool, p *field.Path) field.ErrorList {
	if name == "" {
		return nil // validateContainer says it is required
	}
	if names[name] {
		return field.ErrorList{field.Duplicate(p.Child("name"), name)}
	}
	names[name] = true
	return nil
}

func validateContainer(c *corev1.Container, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), ""))
	} else {
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), c.Name, msg))
		}
	}
	errs = append(errs, validateImage(c.Image, p.Child("image"))...)
	errs = append(errs, validateContainerSecurity(c.SecurityContext, p.Child("securityContext"))...)
	if c.WorkingDir != "" && !path.IsAbs(c.WorkingDir) {
		errs = append(errs, field.Invalid(p.Child("workingDir"), c.WorkingDir, "must be an absolute path"))
	}
	for i, e := range c.Env {
		np := p.Child("env").Index(i).Child("name")
		if e.Name == "" {
			errs = append(errs, field.Required(np, ""))
			continue
		}
		// Kubernetes' rule since RelaxedEnvironmentVariableValidation went GA.
		for _, msg := range validation.IsRelaxedEnvVarName(e.Name) {
			errs = append(errs, field.Invalid(np, e.Name, msg))
		}
		if e.ValueFrom != nil {
			errs = append(errs, validateEnvSource(e, c, p.Child("env").Index(i).Child("valueFrom"))...)
		}
		if n := len(e.Name) + 1 + len(e.Value) + 1; n > MaxArgBytes {
			errs = append(errs, tooLong(p.Child("env").Index(i).Child("value"), n, "the kernel refuses to start a process with one environment variable (NAME=value) over"))
		}
	}
	for i, ef := range c.EnvFrom {
		errs = append(errs, validateEnvFrom(ef, p.Child("envFrom").Index(i))...)
	}
	for _, f := range []struct {
		name string
		args []string
	}{{"command", c.Command}, {"args", c.Args}} {
		for i, arg := range f.args {
			if len(arg)+1 > MaxArgBytes {
				errs = append(errs, tooLong(p.Child(f.name).Index(i), len(arg)+1, "the kernel refuses to start a process with one argument over"))
			}
		}
	}
	portNames := make(map[string]bool)
	for i, port := range c.Ports {
		pp := p.Child("ports").Index(i)
		for _, msg := range validation.IsValidPortNum(int(port.ContainerPort)) {
			errs = append(errs, field.Invalid(pp.Child("containerPort"), port.ContainerPort, msg))
		}
		if port.Name != "" {
			for _, msg := range validation.IsValidPortName(port.Name) {
				errs = append(errs, field.Invalid(pp.Child("name"), port.Name, msg))
			}
			if portNames[port.Name] {
				errs = append(errs, field.Duplicate(pp.Child("name"), port.Name))
			}
			portNames[port.Name] = true
		}
		errs = append(errs, validateProtocol(port.Protocol, pp.Child("protocol"))...)
	}
	errs = append(errs, validateResources(&c.Resources, p.Child("resources"))...)
	errs = append(errs, validateProbe(c.ReadinessProbe, false, portNames, p.Child("readinessProbe"))...)
	errs = append(errs, validateProbe(c.LivenessProbe, true, portNames, p.Child("livenessProbe"))...)
	errs = append(errs, validateProbe(c.StartupProbe, true, portNames, p.Child("startupProbe"))...)
	switch c.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, field.NotSupported(p.Child("imagePullPolicy"), c.ImagePullPolicy, []corev1.PullPolicy{
			corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever,
		}))
	}
	switch c.TerminationMessagePolicy {
	case "", corev1.TerminationMessageReadFile, corev1.TerminationMessageFallbackToLogsOnError:
	default:
		errs = append(errs, field.NotSupported(p.Child("terminationMessagePolicy"), c.TerminationMessagePolicy, []corev1.TerminationMessagePolicy{
			corev1.TerminationMessageReadFile, corev1.TerminationMessageFallbackToLogsOnError,
		}))
	}
	return errs
}

// MaxArgBytes is the kernel's limit on one argument or environment string
// of execve(2), its terminating NUL included: MAX_ARG_STRLEN, 32 pages of
// 4 KiB (include/uapi/linux/binfmts.h). A longer one makes the container's
// start fail with E2BIG.
const MaxArgBytes = 32 * 4096

// tooLong reports a string over MaxArgBytes without echoing it.
func tooLong(p *field.Path, n int, why string) *field.Error {
	return field.Invalid(p, fmt.Sprintf("<%d bytes>", n), fmt.Sprintf("%s %d bytes (MAX_ARG_STRLEN); pass large data as a file instead", why, MaxArgBytes))
}

// validateImage checks that image is a reference containerd can pull; the
// API server only checks for blanks, but failing here beats a replica stuck
// in pull errors on every node.
func validateImage(image string, p *field.Path) field.ErrorList {
	switch {
	case image == "":
		return field.ErrorList{field.Required(p, "")}
	case strings.TrimSpace(image) != image:
		return field.ErrorList{field.Invalid(p, image, "must not have leading or trailing whitespace")}
	}
	if _, err := reference.ParseNormalizedNamed(image); err != nil {
		return field.ErrorList{field.Invalid(p, image, "must be a valid image reference: "+err.Error())}
	}
	return nil
}

func validateProtocol(proto corev1.Protocol, p *field.Path) field.ErrorList {
	switch proto {
	case corev1.ProtocolTCP, corev1.ProtocolUDP:
		return nil
	case "":
		return field.ErrorList{field.Required(p, "")}
	default:
		return field.ErrorList{field.NotSupported(p, proto, []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP})}
	}
}

// supportedResources are the only resources Starling enforces.
var supportedResources = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}

func validateResources(r *corev1.ResourceRequirements, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, list := range []struct {
		name string
		rl   corev1.ResourceList
	}{{"limits", r.Limits}, {"requests", r.Requests}} {
		lp := p.Child(list.name)
		for _, name := range slices.Sorted(maps.Keys(list.rl)) {
			q := list.rl[name]
			kp := lp.Key(string(name))
			if name != corev1.ResourceCPU && name != corev1.ResourceMemory {
				errs = append(errs, field.NotSupported(kp, name, supportedResources))
				continue
			}
			if q.Sign() < 0 {
				errs = append(errs, field.Invalid(kp, q.String(), apivalidation.IsNegativeErrorMsg))
			}
		}
	}
	for _, name := range supportedResources {
		req, hasReq := r.Requests[name]
		limit, hasLimit := r.Limits[name]
		if hasReq && hasLimit && req.Cmp(limit) > 0 {
			errs = append(errs, field.Invalid(p.Child("requests").Key(string(name)), req.String(),
				fmt.Sprintf("must be less than or equal to %s limit of %s", name, limit.String())))
		}
	}
	return errs
}

// MaxLifecycleBytes bounds a container's lifecycle hooks as JSON: they are
// kept with the container in containerd, whose labels (key and value)
// are limited to 4096 bytes.
const MaxLifecycleBytes = 3072

// validateLifecycle follows Kubernetes' validateLifecycle for the
// handlers Starling runs (exec, httpGet, sleep; tcpSocket, which the
// kubelet never runs, is refused by the field walk). grace is the pod's
// terminationGracePeriodSeconds: a sleep may not outlast it.
func validateLifecycle(c *corev1.Container, grace int64, p *field.Path) field.ErrorList {
	l := c.Lifecycle
	if l == nil {
		return nil
	}
	portNames := map[string]bool{}
	for _, port := range c.Ports {
		if port.Name != "" {
			portNames[port.Name] = true
		}
	}
	var errs field.ErrorList
	for _, h := range []struct {
		name    string
		handler *corev1.LifecycleHandler
	}{{"postStart", l.PostStart}, {"preStop", l.PreStop}} {
		if h.handler == nil {
			continue
		}
		hp := p.Child(h.name)
		var handlers []string
		if e := h.handler.Exec; e != nil {
			handlers = append(handlers, "exec")
			if len(e.Command) == 0 {
				errs = append(errs, field.Required(hp.Child("exec", "command"), ""))
			}
		}
		if g := h.handler.HTTPGet; g != nil {
			handlers = append(handlers, "httpGet")
			// The probe's rules: a port of the container, a path from
			// "/", http or https, valid header names.
			errs = append(errs, validateProbe(&corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: g}}, false, portNames, hp)...)
			if g.Host != "" {
				if _, err := netip.ParseAddr(g.Host); err != nil {
					errs = append(errs, field.Invalid(hp.Child("httpGet", "host"), g.Host, "must be an IP address (Starling resolves no names for hooks); leave it out for the pod's own address"))
				}
			}
		}
		if sl := h.handler.Sleep; sl != nil {
			handlers = append(handlers, "sleep")
			if sl.Seconds < 0 || sl.Seconds > grace {
				errs = append(errs, field.Invalid(hp.Child("sleep", "seconds"), sl.Seconds, fmt.Sprintf("must be between 0 and terminationGracePeriodSeconds (%d)", grace)))
			}
		}
		if h.handler.TCPSocket != nil {
			handlers = append(handlers, "tcpSocket")
		}
		switch {
		case len(handlers) == 0:
			errs = append(errs, field.Required(hp, "must specify a handler type: exec, httpGet or sleep"))
		case len(handlers) > 1:
			errs = append(errs, field.Forbidden(hp.Child(handlers[1]), "may not specify more than 1 handler type"))
		}
	}
	if b, err := json.Marshal(l); err == nil && len(b) > MaxLifecycleBytes {
		errs = append(errs, field.Invalid(p, fmt.Sprintf("<%d bytes>", len(b)), fmt.Sprintf("hooks must fit in %d bytes as JSON; run a script from the image instead", MaxLifecycleBytes)))
	}
	return errs
}

// validateProbe follows Kubernetes' validateProbe; portNames are the
// container's named ports, which named probe ports must refer to.
func validateProbe(pr *corev1.Probe, mustSucceedOnce bool, portNames map[string]bool, p *field.Path) field.ErrorList {
	if pr == nil {
		return nil
	}
	var errs field.ErrorList
	var handlers []string
	if pr.Exec != nil {
		handlers = append(handlers, "exec")
		if len(pr.Exec.Command) == 0 {
			errs = append(errs, field.Required(p.Child("exec", "command"), ""))
		}
	}
	if h := pr.HTTPGet; h != nil {
		handlers = append(handlers, "httpGet")
		hp := p.Child("httpGet")
		errs = append(errs, validateProbePort(h.Port, portNames, hp.Child("port"))...)
		if h.Path != "" && !strings.HasPrefix(h.Path, "/") {
			errs = append(errs, field.Invalid(hp.Child("path"), h.Path, "must start with '/'"))
		}
		switch h.Scheme {
		case "", corev1.URISchemeHTTP, corev1.URISchemeHTTPS:
		default:
			errs = append(errs, field.NotSupported(hp.Child("scheme"), h.Scheme, []corev1.URIScheme{corev1.URISchemeHTTP, corev1.URISchemeHTTPS}))
		}
		for i, hdr := range h.HTTPHeaders {
			for _, msg := range validation.IsHTTPHeaderName(hdr.Name) {
				errs = append(errs, field.Invalid(hp.Child("httpHeaders").Index(i).Child("name"), hdr.Name, msg))
			}
		}
	}
	if pr.TCPSocket != nil {
		handlers = append(handlers, "tcpSocket")
		errs = append(errs, validateProbePort(pr.TCPSocket.Port, portNames, p.Child("tcpSocket", "port"))...)
	}
	if pr.GRPC != nil {
		// Reported as unsupported by the field walk; counted here so a
		// grpc-only probe does not also read as missing its handler.
		handlers = append(handlers, "grpc")
	}
	switch {
	case len(handlers) == 0:
		errs = append(errs, field.Required(p, "must specify a handler type"))
	case len(handlers) > 1:
		errs = append(errs, field.Forbidden(p.Child(handlers[1]), "may not specify more than 1 handler type"))
	}
	errs = append(errs, nonNegative(int64(pr.InitialDelaySeconds), p.Child("initialDelaySeconds"))...)
	errs = append(errs, nonNegative(int64(pr.TimeoutSeconds), p.Child("timeoutSeconds"))...)
	errs = append(errs, nonNegative(int64(pr.PeriodSeconds), p.Child("periodSeconds"))...)
	errs = append(errs, nonNegative(int64(pr.SuccessThreshold), p.Child("successThreshold"))...)
	errs = append(errs, nonNegative(int64(pr.FailureThreshold), p.Child("failureThreshold"))...)
	if mustSucceedOnce && pr.SuccessThreshold != 1 {
		errs = append(errs, field.Invalid(p.Child("successThreshold"), pr.SuccessThreshold, "must be 1"))
	}
	return errs
}

func validateProbePort(port intstr.IntOrString, portNames map[string]bool, p *field.Path) field.ErrorList {
	errs := validatePortNumOrName(port, p)
	if len(errs) == 0 && port.Type == intstr.String && !portNames[port.StrVal] {
		errs = append(errs, field.Invalid(p, port.StrVal, "must be the name of one of the container's ports"))
	}
	return errs
}

func validatePortNumOrName(port intstr.IntOrString, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch port.Type {
	case intstr.Int:
		for _, msg := range validation.IsValidPortNum(int(port.IntVal)) {
			errs = append(errs, field.Invalid(p, port.IntVal, msg))
		}
	case intstr.String:
		for _, msg := range validation.IsValidPortName(port.StrVal) {
			errs = append(errs, field.Invalid(p, port.StrVal, msg))
		}
	default:
		errs = append(errs, field.Invalid(p, port, "must be a port number or name"))
	}
	return errs
}

// validateServiceSpec follows Kubernetes' ValidateService
// (k8s.io/kubernetes/pkg/apis/core/validation) for the supported subset.
func validateServiceSpec(s *corev1.ServiceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch s.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	case corev1.ServiceTypeExternalName:
		return validateExternalName(s, p)
	default:
		errs = append(errs, field.NotSupported(p.Child("type"), s.Type,
			[]corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName}))
	}
	errs = append(errs, validateLoadBalancer(s, p)...)
	if s.ExternalName != "" {
		errs = append(errs, field.Forbidden(p.Child("externalName"), "may only be set when `type` is 'ExternalName'"))
	}
	// A Service without a selector is valid, as in Kubernetes; it simply
	// has no endpoints, since Starling has no Endpoints API to fill by hand.
	errs = append(errs, validateLabels(s.Selector, p.Child("selector"))...)
	errs = append(errs, validateClusterIP(s, p)...)

	switch n := len(s.IPFamilies); {
	case n > 1:
		e := field.TooMany(p.Child("ipFamilies"), n, 1)
		e.Detail += ": dual-stack Services are not supported by Starling yet"
		errs = append(errs, e)
	}
	for i, f := range s.IPFamilies {
		if f != corev1.IPv4Protocol {
			errs = append(errs, field.NotSupported(p.Child("ipFamilies").Index(i), f, []corev1.IPFamily{corev1.IPv4Protocol}))
		}
	}
	if s.IPFamilyPolicy != nil && *s.IPFamilyPolicy != corev1.IPFamilyPolicySingleStack {
		errs = append(errs, field.NotSupported(p.Child("ipFamilyPolicy"), *s.IPFamilyPolicy, []corev1.IPFamilyPolicy{corev1.IPFamilyPolicySingleStack}))
	}
	if s.InternalTrafficPolicy != nil && *s.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyCluster {
		errs = append(errs, field.NotSupported(p.Child("internalTrafficPolicy"), *s.InternalTrafficPolicy,
			[]corev1.ServiceInternalTrafficPolicy{corev1.ServiceInternalTrafficPolicyCluster}))
	}
	if etp := s.ExternalTrafficPolicy; etp != "" {
		switch {
		case s.Type == corev1.ServiceTypeClusterIP:
			errs = append(errs, field.Invalid(p.Child("externalTrafficPolicy"), etp, "may only be set when `type` is 'NodePort' or 'LoadBalancer'"))
		case etp != corev1.ServiceExternalTrafficPolicyCluster && etp != corev1.ServiceExternalTrafficPolicyLocal:
			errs = append(errs, field.NotSupported(p.Child("externalTrafficPolicy"), etp,
				[]corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal}))
		}
	}
	if s.SessionAffinity != corev1.ServiceAffinityNone {
		errs = append(errs, field.NotSupported(p.Child("sessionAffinity"), s.SessionAffinity, []corev1.ServiceAffinity{corev1.ServiceAffinityNone}))
	}
	return append(errs, validateServicePorts(s, p.Child("ports"))...)
}

// validateExternalName checks an ExternalName Service, as Kubernetes
// does: a DNS name to stand for, no ClusterIP, no selector needed; its
// ports, if any, are only checked (DNS answers a CNAME, whatever the
// port).
func validateExternalName(s *corev1.ServiceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	name := strings.TrimSuffix(s.ExternalName, ".")
	if name == "" {
		errs = append(errs, field.Required(p.Child("externalName"), "the DNS name the Service stands for, e.g. db.example.com"))
	}
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		if name != "" {
			errs = append(errs, field.Invalid(p.Child("externalName"), s.ExternalName, msg))
		}
	}
	if s.ClusterIP != "" || len(s.ClusterIPs) > 0 {
		errs = append(errs, field.Forbidden(p.Child("clusterIP"), "may not be set for an ExternalName Service"))
	}
	if len(s.Ports) > 0 {
		errs = append(errs, validateServicePorts(s, p.Child("ports"))...)
	}
	return errs
}

func validateClusterIP(s *corev1.ServiceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	cp := p.Child("clusterIP")
	switch s.ClusterIP {
	case "":
	case corev1.ClusterIPNone:
		// Headless: no ClusterIP, no rules; its names come with Service DNS.
		if s.Type != corev1.ServiceTypeClusterIP {
			errs = append(errs, field.Invalid(p.Child("type"), s.Type, "a headless Service (clusterIP: None) must be of type ClusterIP"))
		}
	default:
		if a, err := netip.ParseAddr(s.ClusterIP); err != nil || !a.Is4() {
			errs = append(errs, field.Invalid(cp, s.ClusterIP, "must be a valid IPv4 address"))
		}
	}
	ips := p.Child("clusterIPs")
	switch n := len(s.ClusterIPs); {
	case n > 1:
		e := field.TooMany(ips, n, 1)
		e.Detail += ": dual-stack Services are not supported by Starling yet"
		errs = append(errs, e)
	case n == 1 && s.ClusterIPs[0] != s.ClusterIP:
		errs = append(errs, field.Invalid(ips.Index(0), s.ClusterIPs[0], "must be equal to `clusterIP`"))
	}
	return errs
}

func validateServicePorts(s *corev1.ServiceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(s.Ports) == 0 {
		return field.ErrorList{field.Required(p, "")}
	}
	type portKey struct {
		port  int32
		proto corev1.Protocol
	}
	names := make(map[string]bool)
	ports := make(map[portKey]bool)
	nodePorts := make(map[portKey]bool)
	for i, port := range s.Ports {
		pp := p.Index(i)
		switch {
		case port.Name == "" && len(s.Ports) > 1:
			errs = append(errs, field.Required(pp.Child("name"), ""))
		case port.Name != "":
			for _, msg := range validation.IsDNS1123Label(port.Name) {
				errs = append(errs, field.Invalid(pp.Child("name"), port.Name, msg))
			}
			if names[port.Name] {
				errs = append(errs, field.Duplicate(pp.Child("name"), port.Name))
			}
			names[port.Name] = true
		}
		errs = append(errs, validateProtocol(port.Protocol, pp.Child("protocol"))...)
		for _, msg := range validation.IsValidPortNum(int(port.Port)) {
			errs = append(errs, field.Invalid(pp.Child("port"), port.Port, msg))
		}
		if k := (portKey{port.Port, port.Protocol}); ports[k] {
			errs = append(errs, field.Duplicate(pp.Child("port"), port.Port))
		} else {
			ports[k] = true
		}
		errs = append(errs, validatePortNumOrName(port.TargetPort, pp.Child("targetPort"))...)
		if port.NodePort == 0 {
			continue
		}
		np := pp.Child("nodePort")
		switch {
		case s.Type != corev1.ServiceTypeNodePort && s.Type != corev1.ServiceTypeLoadBalancer:
			errs = append(errs, field.Forbidden(np, fmt.Sprintf("may not be used when `type` is '%s'", s.Type)))
		case port.NodePort < NodePortMin || port.NodePort > NodePortMax:
			errs = append(errs, field.Invalid(np, port.NodePort, validation.InclusiveRangeError(NodePortMin, NodePortMax)))
		default:
			if k := (portKey{port.NodePort, port.Protocol}); nodePorts[k] {
				errs = append(errs, field.Duplicate(np, port.NodePort))
			} else {
				nodePorts[k] = true
			}
		}
	}
	return errs
}

// Bounds of a pod's DNS settings: Kubernetes' (pkg/apis/core/validation/validation.go,
// validatePodDNSConfig), which are the resolver's.
const (
	maxDNSNameservers     = 3
	maxDNSSearchDomains   = 32
	maxDNSSearchListChars = 2048
)

// validatePodDNS checks hostname, subdomain, hostAliases and dnsConfig as
// Kubernetes does.
func validatePodDNS(s *corev1.PodSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct {
		name, v string
	}{{"hostname", s.Hostname}, {"subdomain", s.Subdomain}} {
		if f.v == "" {
			continue
		}
		for _, msg := range validation.IsDNS1123Label(f.v) {
			errs = append(errs, field.Invalid(p.Child(f.name), f.v, msg))
		}
	}
	for i, h := range s.HostAliases {
		hp := p.Child("hostAliases").Index(i)
		if _, err := netip.ParseAddr(h.IP); err != nil {
			errs = append(errs, field.Invalid(hp.Child("ip"), h.IP, "must be a valid IP address"))
		}
		for j, name := range h.Hostnames {
			for _, msg := range validation.IsDNS1123Subdomain(name) {
				errs = append(errs, field.Invalid(hp.Child("hostnames").Index(j), name, msg))
			}
		}
	}
	dp := p.Child("dnsConfig")
	if s.DNSPolicy == corev1.DNSNone && (s.DNSConfig == nil || len(s.DNSConfig.Nameservers) == 0) {
		errs = append(errs, field.Required(dp.Child("nameservers"), "must provide at least one DNS nameserver when dnsPolicy is None"))
	}
	dc := s.DNSConfig
	if dc == nil {
		return errs
	}
	if len(dc.Nameservers) > maxDNSNameservers {
		errs = append(errs, field.Invalid(dp.Child("nameservers"), dc.Nameservers, fmt.Sprintf("must not have more than %d nameservers", maxDNSNameservers)))
	}
	for i, ns := range dc.Nameservers {
		if _, err := netip.ParseAddr(ns); err != nil {
			errs = append(errs, field.Invalid(dp.Child("nameservers").Index(i), ns, "must be a valid IP address"))
		}
	}
	if len(dc.Searches) > maxDNSSearchDomains {
		errs = append(errs, field.Invalid(dp.Child("searches"), dc.Searches, fmt.Sprintf("must not have more than %d search paths", maxDNSSearchDomains)))
	}
	if n := len(strings.Join(dc.Searches, " ")); n > maxDNSSearchListChars {
		errs = append(errs, field.Invalid(dp.Child("searches"), dc.Searches, fmt.Sprintf("must not have more than %d characters (including spaces) in the search list", maxDNSSearchListChars)))
	}
	for i, d := range dc.Searches {
		for _, msg := range validation.IsDNS1123Subdomain(strings.TrimSuffix(d, ".")) {
			errs = append(errs, field.Invalid(dp.Child("searches").Index(i), d, msg))
		}
	}
	for i, o := range dc.Options {
		if o.Name == "" {
			errs = append(errs, field.Required(dp.Child("options").Index(i).Child("name"), "must not be empty"))
		}
		if strings.ContainsAny(o.Name, " \t\n:") || o.Value != nil && strings.ContainsAny(*o.Value, " \t\n") {
			errs = append(errs, field.Invalid(dp.Child("options").Index(i), o.Name, "must not contain spaces, tabs, line breaks (or a colon in the name)"))
		}
	}
	return errs
}

// AddableCapabilities are the capabilities a container may add: those of
// the Pod Security Standards' baseline profile (the container runtime's
// default set, NET_RAW among them, which Starling drops by default).
var AddableCapabilities = []string{"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
	"NET_BIND_SERVICE", "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}

// validateContainerSecurity checks a container's securityContext: the
// subset Starling applies (fields.go), privileged refused, capabilities
// added only from AddableCapabilities.
func validateContainerSecurity(sc *corev1.SecurityContext, p *field.Path) field.ErrorList {
	if sc == nil {
		return nil
	}
	errs := validateIDs(sc.RunAsUser, sc.RunAsGroup, p)
	if sc.Privileged != nil && *sc.Privileged {
		errs = append(errs, field.Forbidden(p.Child("privileged"), "privileged containers are not supported: they can take over the node"))
	}
	if sc.Capabilities != nil {
		for i, c := range sc.Capabilities.Add {
			if !slices.Contains(AddableCapabilities, strings.TrimPrefix(string(c), "CAP_")) {
				errs = append(errs, field.NotSupported(p.Child("capabilities", "add").Index(i), c, AddableCapabilities))
			}
		}
		for i, c := range sc.Capabilities.Drop {
			name := strings.TrimPrefix(string(c), "CAP_")
			if name != "ALL" && (name == "" || strings.ToUpper(name) != name || strings.ContainsAny(name, " \t\n")) {
				errs = append(errs, field.Invalid(p.Child("capabilities", "drop").Index(i), c, "must be a capability name such as NET_RAW, or ALL"))
			}
		}
	}
	return append(errs, validateSeccomp(sc.SeccompProfile, p.Child("seccompProfile"))...)
}

func validateIDs(user, group *int64, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct {
		name string
		v    *int64
	}{{"runAsUser", user}, {"runAsGroup", group}} {
		if f.v != nil && (*f.v < 0 || *f.v > math.MaxInt32) {
			errs = append(errs, field.Invalid(p.Child(f.name), *f.v, "must be between 0 and 2147483647, inclusive"))
		}
	}
	return errs
}

func validateSeccomp(sp *corev1.SeccompProfile, p *field.Path) field.ErrorList {
	if sp == nil {
		return nil
	}
	switch sp.Type {
	case corev1.SeccompProfileTypeRuntimeDefault, corev1.SeccompProfileTypeUnconfined:
		return nil
	}
	return field.ErrorList{field.NotSupported(p.Child("type"), sp.Type, []corev1.SeccompProfileType{corev1.SeccompProfileTypeRuntimeDefault, corev1.SeccompProfileTypeUnconfined})}
}
