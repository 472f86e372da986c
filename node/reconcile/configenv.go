package reconcile

import (
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ConfigData gives the data of the ConfigMaps and Secrets a node holds
// (view.ConfigData): a ConfigMap's data and binaryData (which env never
// takes, as with the kubelet) or a Secret's, by namespace and name; ok
// false when there is no such object.
type ConfigData interface {
	ConfigMap(namespace, name string) (data map[string]string, binary map[string][]byte, ok bool)
	Secret(namespace, name string) (data map[string][]byte, ok bool)
}

// ClaimWait says why a replica that mounts a PersistentVolumeClaim
// waits, Pending: the claim is missing, not bound yet, or its volume is
// on another node or not made yet.
type ClaimWait struct{ Msg string }

func (e *ClaimWait) Error() string { return e.Msg }

// ConfigErrorReason is the REASON of a replica held back by a missing
// ConfigMap, Secret or key, as the kubelet names it.
const ConfigErrorReason = "CreateContainerConfigError"

// ConfigError says which object or key holds a replica back, in the
// kubelet's words (`configmap "app" not found`, `couldn't find key
// mode in ConfigMap default/app`).
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

// ResolveEnv returns s's environment with every ConfigMap and Secret
// reference replaced by its value (Literal, not expanded), as the
// kubelet's makeEnvironmentVariables builds it: envFrom's variables
// first, in source order and each source's keys in order (a key that is
// not a valid variable name, by Kubernetes' relaxed rule, skipped), then env's, which win; a value of
// env may refer ($(NAME)) to any of them. A missing object or key that
// is not optional is a *ConfigError naming it; an optional one is left
// out.
func ResolveEnv(s Spec, namespace string, src ConfigData) ([]EnvVar, error) {
	var out []EnvVar
	for _, f := range s.EnvFrom {
		data, kind, name, ok := envFromData(f, namespace, src)
		if !ok {
			if f.Optional {
				continue
			}
			return nil, &ConfigError{fmt.Sprintf("%s %q not found", kind, name)}
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			if len(validation.IsRelaxedEnvVarName(f.Prefix+k)) > 0 {
				continue // the kubelet skips these too (an event says so)
			}
			out = append(out, EnvVar{Name: f.Prefix + k, Value: data[k], Literal: true})
		}
	}
	for _, e := range s.Env {
		if e.ConfigMap == "" && e.Secret == "" {
			out = append(out, e)
			continue
		}
		v, found, err := keyRef(e, namespace, src)
		if err != nil {
			return nil, err
		}
		if found {
			out = append(out, EnvVar{Name: e.Name, Value: v, Literal: true})
		}
	}
	return out, nil
}

// envFromData is the data an envFrom source names, as strings.
func envFromData(f EnvFrom, namespace string, src ConfigData) (data map[string]string, kind, name string, ok bool) {
	if f.ConfigMap != "" {
		data, _, ok = src.ConfigMap(namespace, f.ConfigMap)
		return data, "configmap", f.ConfigMap, ok
	}
	sec, ok := src.Secret(namespace, f.Secret)
	data = make(map[string]string, len(sec))
	for k, v := range sec {
		data[k] = string(v)
	}
	return data, "secret", f.Secret, ok
}

// keyRef is the value of a configMapKeyRef or secretKeyRef e: found
// false for an optional miss, a *ConfigError in the kubelet's words for
// another.
func keyRef(e EnvVar, namespace string, src ConfigData) (string, bool, error) {
	kind, name, title := "configmap", e.ConfigMap, "ConfigMap"
	var v string
	var ok, has bool
	if e.Secret != "" {
		kind, name, title = "secret", e.Secret, "Secret"
		var data map[string][]byte
		data, ok = src.Secret(namespace, name)
		b, in := data[e.Key]
		v, has = string(b), in
	} else {
		var data map[string]string
		data, _, ok = src.ConfigMap(namespace, name)
		v, has = data[e.Key]
	}
	switch {
	case ok && has:
		return v, true, nil
	case e.Optional:
		return "", false, nil
	case !ok:
		return "", false, &ConfigError{fmt.Sprintf("%s %q not found", kind, name)}
	}
	return "", false, &ConfigError{fmt.Sprintf("couldn't find key %s in %s %s/%s", e.Key, title, namespace, name)}
}
