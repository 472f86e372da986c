package manifest

import (
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// volumeFields are the pod volume fields Starling implements: emptyDir
// (medium Memory as tmpfs), persistentVolumeClaim (data on one node),
// configMap, secret, downwardAPI and projected
// (their files updated in place when the object changes, through the
// kubelet's ..data symlink), hostPath under the prefixes the agent
// allows (--allow-host-path).
var volumeFields = concat(
	[]string{"name", "emptyDir.medium", "emptyDir.sizeLimit", "hostPath.path", "hostPath.type",
		"persistentVolumeClaim.claimName", "persistentVolumeClaim.readOnly"},
	prefixed("configMap.", "name", "defaultMode", "optional", "items[].key", "items[].path", "items[].mode"),
	prefixed("secret.", "secretName", "defaultMode", "optional", "items[].key", "items[].path", "items[].mode"),
	prefixed("downwardAPI.", "defaultMode", "items[].path", "items[].mode", "items[].fieldRef.fieldPath", "items[].fieldRef.apiVersion",
		"items[].resourceFieldRef.containerName", "items[].resourceFieldRef.resource", "items[].resourceFieldRef.divisor"),
	prefixed("projected.", "defaultMode",
		"sources[].configMap.name", "sources[].configMap.optional", "sources[].configMap.items[].key", "sources[].configMap.items[].path", "sources[].configMap.items[].mode",
		"sources[].secret.name", "sources[].secret.optional", "sources[].secret.items[].key", "sources[].secret.items[].path", "sources[].secret.items[].mode",
		"sources[].downwardAPI.items[].path", "sources[].downwardAPI.items[].mode", "sources[].downwardAPI.items[].fieldRef.fieldPath", "sources[].downwardAPI.items[].fieldRef.apiVersion",
		"sources[].downwardAPI.items[].resourceFieldRef.containerName", "sources[].downwardAPI.items[].resourceFieldRef.resource", "sources[].downwardAPI.items[].resourceFieldRef.divisor"),
)

// volumeMountFields are a container's volumeMounts fields Starling
// implements (a mount propagation of None only).
var volumeMountFields = []string{"name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation"}

// DownwardFieldPaths are the fields a downwardAPI volume item may name.
var DownwardFieldPaths = []string{"metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations"}

// validateVolumes checks a pod's volumes and its containers' mounts of
// them, as Kubernetes' ValidateVolumes and ValidateVolumeMounts do for
// the kinds Starling implements.
func validateVolumes(s *corev1.PodSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := map[string]bool{}
	for i, v := range s.Volumes {
		vp := p.Child("volumes").Index(i)
		switch {
		case v.Name == "":
			errs = append(errs, field.Required(vp.Child("name"), ""))
		case names[v.Name]:
			errs = append(errs, field.Duplicate(vp.Child("name"), v.Name))
		default:
			for _, msg := range validation.IsDNS1123Label(v.Name) {
				errs = append(errs, field.Invalid(vp.Child("name"), v.Name, msg))
			}
		}
		names[v.Name] = true
		errs = append(errs, validateVolumeSource(v.VolumeSource, vp)...)
	}
	for _, list := range []struct {
		name       string
		containers []corev1.Container
	}{{"initContainers", s.InitContainers}, {"containers", s.Containers}} {
		for ci, c := range list.containers {
			errs = append(errs, validateMounts(c, names, p.Child(list.name).Index(ci))...)
		}
	}
	return errs
}

// validateMounts checks the volumeMounts of container c (at p) against
// the pod's volumes (names).
func validateMounts(c corev1.Container, names map[string]bool, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	mounted := map[string]bool{}
	for i, m := range c.VolumeMounts {
		mp := p.Child("volumeMounts").Index(i)
		if !names[m.Name] {
			errs = append(errs, field.NotFound(mp.Child("name"), m.Name))
		}
		switch {
		case m.MountPath == "":
			errs = append(errs, field.Required(mp.Child("mountPath"), ""))
		case !path.IsAbs(m.MountPath):
			errs = append(errs, field.Invalid(mp.Child("mountPath"), m.MountPath, "must be an absolute path"))
		case mounted[path.Clean(m.MountPath)]:
			errs = append(errs, field.Invalid(mp.Child("mountPath"), m.MountPath, "must be unique"))
		}
		mounted[path.Clean(m.MountPath)] = true
		if m.SubPath != "" && m.SubPathExpr != "" {
			errs = append(errs, field.Invalid(mp.Child("subPathExpr"), m.SubPathExpr, "subPathExpr and subPath are mutually exclusive"))
		}
		errs = append(errs, relativePath(m.SubPath, mp.Child("subPath"))...)
		errs = append(errs, relativePath(m.SubPathExpr, mp.Child("subPathExpr"))...)
		if m.MountPropagation != nil && *m.MountPropagation != corev1.MountPropagationNone {
			errs = append(errs, field.NotSupported(mp.Child("mountPropagation"), *m.MountPropagation, []corev1.MountPropagationMode{corev1.MountPropagationNone}))
		}
	}
	return errs
}

// validateVolumeSource checks one volume: exactly one source, of a kind
// Starling implements (the others are refused as not supported by
// unsupportedFields), its files' paths and modes.
func validateVolumeSource(v corev1.VolumeSource, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	set := 0
	for _, b := range []bool{v.EmptyDir != nil, v.ConfigMap != nil, v.Secret != nil, v.DownwardAPI != nil, v.Projected != nil, v.HostPath != nil, v.PersistentVolumeClaim != nil} {
		if b {
			set++
		}
	}
	if set > 1 {
		return field.ErrorList{field.Forbidden(p, "may not specify more than 1 volume type")}
	}
	switch {
	case v.PersistentVolumeClaim != nil:
		cp := p.Child("persistentVolumeClaim", "claimName")
		if v.PersistentVolumeClaim.ClaimName == "" {
			errs = append(errs, field.Required(cp, "the name of a PersistentVolumeClaim in the pod's namespace"))
		}
		for _, msg := range validation.IsDNS1123Subdomain(v.PersistentVolumeClaim.ClaimName) {
			errs = append(errs, field.Invalid(cp, v.PersistentVolumeClaim.ClaimName, msg))
		}
	case v.ConfigMap != nil:
		errs = append(errs, validateKeyItems(v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.DefaultMode, p.Child("configMap"), "name")...)
	case v.Secret != nil:
		errs = append(errs, validateKeyItems(v.Secret.SecretName, v.Secret.Items, v.Secret.DefaultMode, p.Child("secret"), "secretName")...)
	case v.DownwardAPI != nil:
		errs = append(errs, validateMode(v.DownwardAPI.DefaultMode, p.Child("downwardAPI", "defaultMode"))...)
		errs = append(errs, validateDownwardItems(v.DownwardAPI.Items, p.Child("downwardAPI", "items"))...)
	case v.Projected != nil:
		pp := p.Child("projected")
		errs = append(errs, validateMode(v.Projected.DefaultMode, pp.Child("defaultMode"))...)
		for i, s := range v.Projected.Sources {
			sp := pp.Child("sources").Index(i)
			switch {
			case s.ConfigMap != nil:
				errs = append(errs, validateKeyItems(s.ConfigMap.Name, s.ConfigMap.Items, nil, sp.Child("configMap"), "name")...)
			case s.Secret != nil:
				errs = append(errs, validateKeyItems(s.Secret.Name, s.Secret.Items, nil, sp.Child("secret"), "name")...)
			case s.DownwardAPI != nil:
				errs = append(errs, validateDownwardItems(s.DownwardAPI.Items, sp.Child("downwardAPI", "items"))...)
			}
		}
	case v.HostPath != nil:
		if !path.IsAbs(v.HostPath.Path) || path.Clean(v.HostPath.Path) != v.HostPath.Path {
			errs = append(errs, field.Invalid(p.Child("hostPath", "path"), v.HostPath.Path, "must be an absolute, clean path"))
		}
		if t := v.HostPath.Type; t != nil && *t != corev1.HostPathUnset && *t != corev1.HostPathDirectory && *t != corev1.HostPathDirectoryOrCreate {
			errs = append(errs, field.NotSupported(p.Child("hostPath", "type"), *t, []corev1.HostPathType{corev1.HostPathUnset, corev1.HostPathDirectory, corev1.HostPathDirectoryOrCreate}))
		}
	case v.EmptyDir != nil:
		if m := v.EmptyDir.Medium; m != corev1.StorageMediumDefault && m != corev1.StorageMediumMemory {
			errs = append(errs, field.NotSupported(p.Child("emptyDir", "medium"), m, []corev1.StorageMedium{corev1.StorageMediumDefault, corev1.StorageMediumMemory}))
		}
		if q := v.EmptyDir.SizeLimit; q != nil && q.Sign() < 0 {
			errs = append(errs, field.Invalid(p.Child("emptyDir", "sizeLimit"), q.String(), "must be greater than or equal to 0"))
		}
	}
	return errs
}

// validateKeyItems checks a configMap or secret source: its object's
// name (nameField), its items' keys and paths, its modes.
func validateKeyItems(name string, items []corev1.KeyToPath, mode *int32, p *field.Path, nameField string) field.ErrorList {
	var errs field.ErrorList
	if name == "" {
		errs = append(errs, field.Required(p.Child(nameField), ""))
	}
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		if name != "" {
			errs = append(errs, field.Invalid(p.Child(nameField), name, msg))
		}
	}
	errs = append(errs, validateMode(mode, p.Child("defaultMode"))...)
	for i, it := range items {
		ip := p.Child("items").Index(i)
		if it.Key == "" {
			errs = append(errs, field.Required(ip.Child("key"), ""))
		}
		errs = append(errs, filePath(it.Path, ip.Child("path"))...)
		errs = append(errs, validateMode(it.Mode, ip.Child("mode"))...)
	}
	return errs
}

// validateDownwardItems checks a downwardAPI source's files.
func validateDownwardItems(items []corev1.DownwardAPIVolumeFile, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, it := range items {
		ip := p.Index(i)
		errs = append(errs, filePath(it.Path, ip.Child("path"))...)
		errs = append(errs, validateMode(it.Mode, ip.Child("mode"))...)
		switch {
		case it.ResourceFieldRef != nil && it.FieldRef != nil:
			errs = append(errs, field.Invalid(ip, "", "fieldRef and resourceFieldRef can not be specified simultaneously"))
		case it.ResourceFieldRef != nil:
			rp := ip.Child("resourceFieldRef")
			if it.ResourceFieldRef.ContainerName == "" {
				errs = append(errs, field.Required(rp.Child("containerName"), "the container whose resource the file holds"))
			}
			errs = append(errs, validateResourceRef(it.ResourceFieldRef, rp)...)
		case it.FieldRef == nil:
			errs = append(errs, field.Required(ip.Child("fieldRef"), ""))
		case !slices.Contains(DownwardFieldPaths, it.FieldRef.FieldPath):
			if _, ok := SubscriptedField(it.FieldRef.FieldPath); !ok {
				errs = append(errs, field.NotSupported(ip.Child("fieldRef", "fieldPath"), it.FieldRef.FieldPath, DownwardFieldPaths))
			}
		}
	}
	return errs
}

// filePath checks a projected file's path: relative, no "..", not empty.
func filePath(p string, fp *field.Path) field.ErrorList {
	if p == "" {
		return field.ErrorList{field.Required(fp, "")}
	}
	if strings.HasPrefix(p, "..") {
		return field.ErrorList{field.Invalid(fp, p, "must not start with '..'")}
	}
	return relativePath(p, fp)
}

// relativePath checks a path that must stay below its volume: relative,
// with no ".." element ("" is no path).
func relativePath(p string, fp *field.Path) field.ErrorList {
	if p == "" {
		return nil
	}
	if path.IsAbs(p) {
		return field.ErrorList{field.Invalid(fp, p, "must be a relative path")}
	}
	if slices.Contains(strings.Split(p, "/"), "..") {
		return field.ErrorList{field.Invalid(fp, p, "must not contain '..'")}
	}
	return nil
}

// validateMode checks a file mode: 0 to 0777.
func validateMode(m *int32, p *field.Path) field.ErrorList {
	if m != nil && (*m < 0 || *m > 0o777) {
		return field.ErrorList{field.Invalid(p, *m, "must be a number between 0 and 0777 (octal), both inclusive")}
	}
	return nil
}
