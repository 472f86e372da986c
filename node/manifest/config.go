package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Kinds of configuration: v1 ConfigMap and v1 Secret. Secrets are stored
// sealed (node/sealed): their values never lie in clear on a node's disk.
const (
	KindConfigMap = "ConfigMap"
	KindSecret    = "Secret"
)

// MaxDataBytes bounds the data of one ConfigMap or Secret: the sum of
// its keys' and values' lengths, as Kubernetes' MaxSecretSize (1 MiB).
const MaxDataBytes = 1 << 20

// SecretTypes are the Secret types whose keys Starling checks, as the
// Kubernetes API server does; any other type that is a qualified name
// (Helm's "helm.sh/release.v1", say) is stored as Opaque is.
var SecretTypes = []corev1.SecretType{
	corev1.SecretTypeOpaque, corev1.SecretTypeTLS, corev1.SecretTypeBasicAuth,
	corev1.SecretTypeDockerConfigJson, corev1.SecretTypeDockercfg, corev1.SecretTypeSSHAuth,
}

var configMapFields = newFieldTree(commonFields, serverOwnedMeta,
	[]string{"data", "binaryData", "immutable"})

var secretFields = newFieldTree(commonFields, serverOwnedMeta,
	[]string{"type", "data", "stringData", "immutable"})

// fromConfigMap defaults c in place, clears server-owned fields and wraps it.
func fromConfigMap(c *corev1.ConfigMap) Object {
	c.APIVersion, c.Kind = "v1", KindConfigMap
	clearMeta(&c.ObjectMeta)
	return Object{Kind: KindConfigMap, Namespace: c.Namespace, Name: c.Name, ConfigMap: c}
}

// fromSecret defaults s in place as the API server does (type Opaque,
// stringData merged over data and cleared), clears server-owned fields
// and wraps it.
func fromSecret(s *corev1.Secret) Object {
	s.APIVersion, s.Kind = "v1", KindSecret
	clearMeta(&s.ObjectMeta)
	// kubectl's record of the applied object holds the values in clear:
	// a Secret's is not kept (its data is sealed, its annotations not).
	delete(s.Annotations, "kubectl.kubernetes.io/last-applied-configuration")
	if len(s.Annotations) == 0 {
		s.Annotations = nil
	}
	if s.Type == "" {
		s.Type = corev1.SecretTypeOpaque
	}
	if len(s.StringData) > 0 {
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		for k, v := range s.StringData {
			s.Data[k] = []byte(v)
		}
		s.StringData = nil
	}
	return Object{Kind: KindSecret, Namespace: s.Namespace, Name: s.Name, Secret: s}
}

// validateConfigMap follows Kubernetes' ValidateConfigMap: keys are
// config map keys, none in both data and binaryData, MaxDataBytes in
// all.
func validateConfigMap(c *corev1.ConfigMap) field.ErrorList {
	errs := validateMeta(&c.ObjectMeta, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))
	if c.Namespace == LBPoolNamespace && c.Name == LBPoolName {
		errs = append(errs, validateLBPool(c)...)
	}
	size := 0
	for _, k := range slices.Sorted(maps.Keys(c.Data)) {
		errs = append(errs, validateDataKey(k, field.NewPath("data").Key(k))...)
		size += len(k) + len(c.Data[k])
	}
	for _, k := range slices.Sorted(maps.Keys(c.BinaryData)) {
		p := field.NewPath("binaryData").Key(k)
		errs = append(errs, validateDataKey(k, p)...)
		if _, dup := c.Data[k]; dup {
			errs = append(errs, field.Invalid(p, k, "duplicate of key present in data"))
		}
		size += len(k) + len(c.BinaryData[k])
	}
	if size > MaxDataBytes {
		errs = append(errs, field.TooLong(field.NewPath("data"), "", MaxDataBytes))
	}
	return append(errs, unsupportedFields(configMapFields, c)...)
}

// validateSecret follows Kubernetes' ValidateSecret: keys are config map
// keys, MaxDataBytes in all, and the keys each known type requires.
func validateSecret(s *corev1.Secret) field.ErrorList {
	errs := validateMeta(&s.ObjectMeta, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))
	data := field.NewPath("data")
	size := 0
	for _, k := range slices.Sorted(maps.Keys(s.Data)) {
		errs = append(errs, validateDataKey(k, data.Key(k))...)
		size += len(k) + len(s.Data[k])
	}
	if size > MaxDataBytes {
		errs = append(errs, field.TooLong(data, "", MaxDataBytes))
	}
	need := func(keys ...string) {
		for _, k := range keys {
			if _, ok := s.Data[k]; !ok {
				errs = append(errs, field.Required(data.Key(k), fmt.Sprintf("a %s Secret holds %s", s.Type, k)))
			}
		}
	}
	validJSON := func(k string) {
		if v, ok := s.Data[k]; ok && !json.Valid(v) {
			errs = append(errs, field.Invalid(data.Key(k), "<secret contents redacted>", "must be valid JSON"))
		}
	}
	switch s.Type {
	case corev1.SecretTypeTLS:
		need(corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	case corev1.SecretTypeBasicAuth:
		_, user := s.Data[corev1.BasicAuthUsernameKey]
		_, pass := s.Data[corev1.BasicAuthPasswordKey]
		if !user && !pass {
			errs = append(errs, field.Required(data, "a kubernetes.io/basic-auth Secret holds username or password (or both)"))
		}
	case corev1.SecretTypeDockerConfigJson:
		need(corev1.DockerConfigJsonKey)
		validJSON(corev1.DockerConfigJsonKey)
	case corev1.SecretTypeDockercfg:
		need(corev1.DockerConfigKey)
		validJSON(corev1.DockerConfigKey)
	case corev1.SecretTypeSSHAuth:
		need(corev1.SSHAuthPrivateKey)
	case corev1.SecretTypeServiceAccountToken, corev1.SecretTypeBootstrapToken:
		errs = append(errs, field.Forbidden(field.NewPath("type"), notSupportedYet+": Starling has no service account tokens"))
	default:
		for _, msg := range validation.IsQualifiedName(string(s.Type)) {
			errs = append(errs, field.Invalid(field.NewPath("type"), s.Type, msg))
		}
	}
	return append(errs, unsupportedFields(secretFields, s)...)
}

// validateDataKey checks a ConfigMap or Secret key: a file name of
// letters, digits, '-', '_' and '.' (validation.IsConfigMapKey).
func validateDataKey(k string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsConfigMapKey(k) {
		errs = append(errs, field.Invalid(p, k, msg))
	}
	return errs
}

// ValidateUpdate returns what Kubernetes refuses in replacing prev by
// obj, two objects of one key: an immutable ConfigMap's or Secret's data
// and its immutable flag, a Secret's type, and a PersistentVolumeClaim's
// spec but for a larger storage request.
func ValidateUpdate(prev, obj Object) field.ErrorList {
	var errs field.ErrorList
	immutable := func(was *bool, now *bool, sameData bool) {
		if was == nil || !*was {
			return
		}
		if now == nil || !*now {
			errs = append(errs, field.Forbidden(field.NewPath("immutable"), "field is immutable when `immutable` is set"))
		}
		if !sameData {
			errs = append(errs, field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set: delete and create the object to change it"))
		}
	}
	switch {
	case prev.ConfigMap != nil && obj.ConfigMap != nil:
		immutable(prev.ConfigMap.Immutable, obj.ConfigMap.Immutable,
			maps.Equal(prev.ConfigMap.Data, obj.ConfigMap.Data) && maps.EqualFunc(prev.ConfigMap.BinaryData, obj.ConfigMap.BinaryData, bytes.Equal))
	case prev.Secret != nil && obj.Secret != nil:
		if prev.Secret.Type != obj.Secret.Type {
			errs = append(errs, field.Invalid(field.NewPath("type"), obj.Secret.Type, "field is immutable: delete and create the Secret to change its type"))
		}
		immutable(prev.Secret.Immutable, obj.Secret.Immutable, maps.EqualFunc(prev.Secret.Data, obj.Secret.Data, bytes.Equal))
	case prev.Claim != nil && obj.Claim != nil:
		errs = append(errs, validateClaimUpdate(prev.Claim, obj.Claim)...)
	case prev.StatefulSet != nil && obj.StatefulSet != nil:
		if !apiequality.Semantic.DeepEqual(prev.StatefulSet.Spec.VolumeClaimTemplates, obj.StatefulSet.Spec.VolumeClaimTemplates) {
			errs = append(errs, field.Forbidden(field.NewPath("spec", "volumeClaimTemplates"),
				"updates to a StatefulSet's volumeClaimTemplates are forbidden: its claims exist; delete the StatefulSet (its claims are kept) and apply it again"))
		}
	}
	return errs
}

// DataSizes returns the size in bytes of each value of a ConfigMap or
// Secret (data and binaryData), what output shows instead of a Secret's
// values; nil for other kinds.
func DataSizes(o Object) map[string]int {
	out := map[string]int{}
	switch {
	case o.ConfigMap != nil:
		for k, v := range o.ConfigMap.Data {
			out[k] = len(v)
		}
		for k, v := range o.ConfigMap.BinaryData {
			out[k] = len(v)
		}
	case o.Secret != nil:
		for k, v := range o.Secret.Data {
			out[k] = len(v)
		}
	default:
		return nil
	}
	return out
}

// validateEnvSource checks an env var of container c's valueFrom as
// Kubernetes' validateEnvVarValueFrom does, for the sources Starling
// fills in: fieldRef, configMapKeyRef, secretKeyRef and
// resourceFieldRef, exactly one of them (the others are refused as not
// supported, unsupportedFields).
func validateEnvSource(e corev1.EnvVar, c *corev1.Container, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	v := e.ValueFrom
	if e.Value != "" {
		errs = append(errs, field.Invalid(p, "", "may not be specified when `value` is not empty"))
	}
	set := 0
	for _, b := range []bool{v.FieldRef != nil, v.ConfigMapKeyRef != nil, v.SecretKeyRef != nil, v.ResourceFieldRef != nil, v.FileKeyRef != nil} {
		if b {
			set++
		}
	}
	switch {
	case set == 0:
		errs = append(errs, field.Required(p, "give one of fieldRef, configMapKeyRef, secretKeyRef or resourceFieldRef"))
	case set > 1:
		errs = append(errs, field.Invalid(p, "", "may not have more than one field specified at a time"))
	case v.FieldRef != nil:
		errs = append(errs, validateFieldRef(v.FieldRef, p.Child("fieldRef"))...)
	case v.ConfigMapKeyRef != nil:
		errs = append(errs, validateKeyRef(v.ConfigMapKeyRef.Name, v.ConfigMapKeyRef.Key, p.Child("configMapKeyRef"))...)
	case v.SecretKeyRef != nil:
		errs = append(errs, validateKeyRef(v.SecretKeyRef.Name, v.SecretKeyRef.Key, p.Child("secretKeyRef"))...)
	case v.ResourceFieldRef != nil:
		errs = append(errs, validateResourceRef(v.ResourceFieldRef, p.Child("resourceFieldRef"))...)
	}
	return errs
}

// EnvResources are the resources an env var's resourceFieldRef may name
// (ephemeral-storage, which Starling does not manage, is not among them).
var EnvResources = []string{"limits.cpu", "limits.memory", "requests.cpu", "requests.memory"}

// validateResourceRef checks a resourceFieldRef as Kubernetes'
// validateContainerResourceFieldSelector does: a resource of
// EnvResources, a divisor of 1m or 1 for CPU and a power of 1000 or 1024
// for bytes. Its containerName is checked against the pod's containers
// (resourceRefContainers).
func validateResourceRef(r *corev1.ResourceFieldSelector, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if !slices.Contains(EnvResources, r.Resource) {
		return append(errs, field.NotSupported(p.Child("resource"), r.Resource, EnvResources))
	}
	divisors := []string{"1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei"}
	if strings.HasSuffix(r.Resource, ".cpu") {
		divisors = []string{"1m", "1"}
	}
	if !r.Divisor.IsZero() && !slices.ContainsFunc(divisors, func(d string) bool { q := resource.MustParse(d); return q.Cmp(r.Divisor) == 0 }) {
		errs = append(errs, field.NotSupported(p.Child("divisor"), r.Divisor.String(), divisors))
	}
	return errs
}

// resourceRefContainers checks that every resourceFieldRef of pod s (of
// its containers' env, of its downwardAPI and projected volumes) names
// one of its containers, as Kubernetes does.
func resourceRefContainers(s *corev1.PodSpec, p *field.Path) field.ErrorList {
	names := map[string]bool{}
	for _, c := range slices.Concat(s.Containers, s.InitContainers) {
		names[c.Name] = true
	}
	var errs field.ErrorList
	check := func(r *corev1.ResourceFieldSelector, at *field.Path) {
		if r != nil && r.ContainerName != "" && !names[r.ContainerName] {
			errs = append(errs, field.NotFound(at.Child("resourceFieldRef", "containerName"), r.ContainerName))
		}
	}
	for _, list := range []struct {
		name       string
		containers []corev1.Container
	}{{"initContainers", s.InitContainers}, {"containers", s.Containers}} {
		for i, c := range list.containers {
			for j, e := range c.Env {
				if e.ValueFrom != nil {
					check(e.ValueFrom.ResourceFieldRef, p.Child(list.name).Index(i).Child("env").Index(j).Child("valueFrom"))
				}
			}
		}
	}
	for i, v := range s.Volumes {
		vp := p.Child("volumes").Index(i)
		if v.DownwardAPI != nil {
			for j, it := range v.DownwardAPI.Items {
				check(it.ResourceFieldRef, vp.Child("downwardAPI", "items").Index(j))
			}
		}
		if v.Projected != nil {
			for k, ps := range v.Projected.Sources {
				if ps.DownwardAPI != nil {
					for j, it := range ps.DownwardAPI.Items {
						check(it.ResourceFieldRef, vp.Child("projected", "sources").Index(k).Child("downwardAPI", "items").Index(j))
					}
				}
			}
		}
	}
	return errs
}

// validateFieldRef checks a downward API field of an env var: one of
// EnvFieldPaths, or metadata.labels['KEY'] / metadata.annotations['KEY']
// with a valid key.
func validateFieldRef(f *corev1.ObjectFieldSelector, p *field.Path) field.ErrorList {
	if f.APIVersion != "" && f.APIVersion != "v1" {
		return field.ErrorList{field.NotSupported(p.Child("apiVersion"), f.APIVersion, []string{"v1"})}
	}
	if slices.Contains(EnvFieldPaths, f.FieldPath) {
		return nil
	}
	if key, ok := SubscriptedField(f.FieldPath); ok {
		var errs field.ErrorList
		for _, msg := range validation.IsQualifiedName(strings.ToLower(key)) {
			errs = append(errs, field.Invalid(p.Child("fieldPath"), f.FieldPath, msg))
		}
		return errs
	}
	return field.ErrorList{field.NotSupported(p.Child("fieldPath"), f.FieldPath, append(slices.Clone(EnvFieldPaths), "metadata.labels['KEY']", "metadata.annotations['KEY']"))}
}

// SubscriptedField returns KEY of a fieldPath metadata.labels['KEY'] or
// metadata.annotations['KEY'] (ok false for any other path).
func SubscriptedField(path string) (key string, ok bool) {
	for _, prefix := range []string{"metadata.labels['", "metadata.annotations['"} {
		if rest, found := strings.CutPrefix(path, prefix); found {
			if k, found := strings.CutSuffix(rest, "']"); found && k != "" {
				return k, true
			}
		}
	}
	return "", false
}

// validateRefName checks the name of the object a reference names.
func validateRefName(name string, p *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(p, "")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

// validateKeyRef checks a configMapKeyRef's or secretKeyRef's name and key.
func validateKeyRef(name, key string, p *field.Path) field.ErrorList {
	errs := validateRefName(name, p.Child("name"))
	if key == "" {
		errs = append(errs, field.Required(p.Child("key"), ""))
	}
	return append(errs, validateDataKeyIfSet(key, p.Child("key"))...)
}

func validateDataKeyIfSet(key string, p *field.Path) field.ErrorList {
	if key == "" {
		return nil
	}
	return validateDataKey(key, p)
}

// validateEnvFrom checks an envFrom entry: exactly one of configMapRef
// and secretRef, with a name, and a prefix that keeps names valid.
func validateEnvFrom(ef corev1.EnvFromSource, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if ef.Prefix != "" {
		for _, msg := range validation.IsRelaxedEnvVarName(ef.Prefix) {
			errs = append(errs, field.Invalid(p.Child("prefix"), ef.Prefix, msg))
		}
	}
	switch {
	case ef.ConfigMapRef == nil && ef.SecretRef == nil:
		errs = append(errs, field.Required(p, "give configMapRef or secretRef"))
	case ef.ConfigMapRef != nil && ef.SecretRef != nil:
		errs = append(errs, field.Invalid(p, "", "may not have more than one field specified at a time"))
	case ef.ConfigMapRef != nil:
		errs = append(errs, validateRefName(ef.ConfigMapRef.Name, p.Child("configMapRef", "name"))...)
	case ef.SecretRef != nil:
		errs = append(errs, validateRefName(ef.SecretRef.Name, p.Child("secretRef", "name"))...)
	}
	return errs
}
