package reconcile

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Volume is one of a pod's volumes: an emptyDir (Memory: on tmpfs), a
// directory of the node (HostPath), or files projected from ConfigMaps,
// Secrets and the downward API (Sources: a configMap, secret or
// downwardAPI volume has one, a projected volume several).
type Volume struct {
	Name string
	// EmptyDir is a directory of the replica's own, removed with it; on
	// tmpfs when Memory, at most SizeLimit bytes (0: no limit).
	EmptyDir, Memory bool
	SizeLimit        int64
	// HostPath is a directory of the node ("": none); HostPathCreate
	// makes it when missing (the type "DirectoryOrCreate").
	HostPath       string
	HostPathCreate bool
	// Claim names a PersistentVolumeClaim of the replica's namespace
	// ("": none), mounted read-only when ClaimReadOnly; ClaimID is its
	// volume's (the claim's UID), filled in when a create starts the
	// replica on the node that holds the claim (Decision.Claims).
	Claim, ClaimID string
	ClaimReadOnly  bool
	// ClaimTemplate: Claim is a StatefulSet's volumeClaimTemplate, and
	// each ordinal mounts its own claim (ClaimName).
	ClaimTemplate bool
	Sources       []FileSource
	// DefaultMode is the mode of projected files (0644 unless set).
	DefaultMode uint32
	// Group is the pod's fsGroup (nil: none): the group that owns an
	// emptyDir (setgid, group-writable) or a volume's projected files.
	Group *int64
}

// ClaimName is the PersistentVolumeClaim replica r mounts through v ("":
// none): v.Claim, or for a StatefulSet's claim template
// "TEMPLATE-STATEFULSET-ORDINAL", as Kubernetes names them.
func (v Volume) ClaimName(r Replica) string {
	if v.ClaimTemplate {
		return TemplateClaimName(v.Claim, r.Workload, r.Ordinal)
	}
	return v.Claim
}

// TemplateClaimName is the claim of ordinal of StatefulSet workload made
// from its volumeClaimTemplate template.
func TemplateClaimName(template, workload string, ordinal int) string {
	return template + "-" + workload + "-" + strconv.Itoa(ordinal)
}

// Sensitive reports whether v holds a Secret's values: such a volume is
// kept on tmpfs, never on the node's disk.
func (v Volume) Sensitive() bool {
	return slices.ContainsFunc(v.Sources, func(s FileSource) bool { return s.Secret != "" })
}

// FileSource is where some of a volume's files come from: a ConfigMap's
// or Secret's keys (Items: the listed ones at their paths; none: every
// key under its own name), or downward API fields (Fields).
type FileSource struct {
	ConfigMap, Secret string
	Optional          bool
	Items             []KeyToPath
	Fields            []FieldFile
}

// KeyToPath projects one key to a file (Mode 0: the volume's default).
type KeyToPath struct {
	Key, Path string
	Mode      uint32
}

// FieldFile projects one downward API field to a file: a field of the
// pod (FieldPath), a container's resource known from its spec (Value),
// or a limit the container does not set, whose value is the node's
// allocatable divided by DivisorMilli (Resource, as EnvVar's).
type FieldFile struct {
	Path, FieldPath string
	Mode            uint32
	Value           string
	Resource        string
	DivisorMilli    int64
}

// Mount is one of a container's volume mounts.
type Mount struct {
	Volume, Path string
	// SubPath mounts a path inside the volume (SubPathExpr: with
	// $(VAR) expanded against the container's env); such a mount of
	// projected files does not follow later changes, as in Kubernetes.
	SubPath, SubPathExpr string
	ReadOnly             bool
}

// File is one projected file: its path in the volume, data and mode.
type File struct {
	Path string
	Data []byte
	Mode uint32
}

// ProjectVolume returns the files of v for replica r from src, as the
// kubelet's configmap, secret, downwardapi and projected volume plugins
// make them: every key (a ConfigMap's data and binaryData) or the listed
// items, downward API fields (labels and annotations as sorted
// key="value" lines) and containers' resources (a limit not set: the
// node's allocatable, alloc). A missing object or listed key that is not
// optional is a *ConfigError naming it; files of a later source replace
// an earlier one's of the same path.
func ProjectVolume(v Volume, r Replica, src ConfigData, alloc Allocatable) ([]File, error) {
	mode := v.DefaultMode
	if mode == 0 {
		mode = 0o644
	}
	byPath := map[string]File{}
	for _, s := range v.Sources {
		if len(s.Fields) > 0 {
			for _, f := range s.Fields {
				value := f.Value
				switch {
				case f.FieldPath != "":
					value = downwardField(f.FieldPath, r)
				case f.Resource != "":
					value = alloc.value(f.Resource, f.DivisorMilli)
				}
				byPath[f.Path] = File{Path: f.Path, Data: []byte(value), Mode: orMode(f.Mode, mode)}
			}
			continue
		}
		data, kind, name, ok := sourceData(s, r.Namespace, src)
		if !ok {
			if s.Optional {
				continue
			}
			return nil, &ConfigError{fmt.Sprintf("%s %q not found", kind, name)}
		}
		if len(s.Items) == 0 {
			for k, d := range data {
				byPath[k] = File{Path: k, Data: d, Mode: mode}
			}
			continue
		}
		for _, it := range s.Items {
			d, has := data[it.Key]
			if !has {
				if s.Optional {
					continue
				}
				what := "config"
				if kind == "secret" {
					what = "secret"
				}
				return nil, &ConfigError{fmt.Sprintf("%s references non-existent %s key: %s", kind, what, it.Key)}
			}
			byPath[it.Path] = File{Path: it.Path, Data: d, Mode: orMode(it.Mode, mode)}
		}
	}
	out := make([]File, 0, len(byPath))
	for _, p := range slices.Sorted(maps.Keys(byPath)) {
		out = append(out, byPath[p])
	}
	return out, nil
}

func orMode(m, def uint32) uint32 {
	if m == 0 {
		return def
	}
	return m
}

// sourceData is the data a ConfigMap or Secret source names (a
// ConfigMap's binaryData with its data).
func sourceData(s FileSource, namespace string, src ConfigData) (data map[string][]byte, kind, name string, ok bool) {
	if s.Secret != "" {
		d, ok := src.Secret(namespace, s.Secret)
		return d, "secret", s.Secret, ok
	}
	d, binary, ok := src.ConfigMap(namespace, s.ConfigMap)
	data = maps.Clone(binary)
	if data == nil {
		data = make(map[string][]byte, len(d))
	}
	for k, v := range d {
		data[k] = []byte(v)
	}
	return data, "configmap", s.ConfigMap, ok
}

// downwardField is the value of a downward API field of r's pod.
func downwardField(fieldPath string, r Replica) string {
	switch fieldPath {
	case "metadata.name":
		return r.Name
	case "metadata.namespace":
		return r.Namespace
	case "metadata.uid":
		return PodUID(r)
	case "metadata.labels":
		return formatMap(r.Spec.Labels)
	case "metadata.annotations":
		return formatMap(r.Spec.Annotations)
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels['": r.Spec.Labels, "metadata.annotations['": r.Spec.Annotations} {
		if rest, ok := strings.CutPrefix(fieldPath, prefix); ok {
			return m[strings.TrimSuffix(rest, "']")]
		}
	}
	return ""
}

// formatMap renders labels or annotations as the kubelet's downward API
// does (FormatMap of the kubelet's fieldpath package): key="value" lines (Go-quoted), sorted by
// key, with no newline after the last.
func formatMap(m map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// CleanSubPath reports whether p stays inside its volume (relative, no
// ".." element): manifest validation guarantees it for a subPath, and a
// subPathExpr is checked again once expanded.
func CleanSubPath(p string) bool {
	return p != "" && !path.IsAbs(p) && !slices.Contains(strings.Split(p, "/"), "..")
}
