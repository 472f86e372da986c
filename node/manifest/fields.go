package manifest

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// notSupportedYet is the detail of every error about a field Starling does
// not implement.
const notSupportedYet = "not supported by Starling yet"

// fieldTree is a set of JSON field paths. A path ending at a leaf allows the
// whole subtree below it (maps of labels, resource lists, int-or-strings).
// "[]" stands for every element of a list.
type fieldTree struct {
	leaf     bool
	children map[string]*fieldTree
}

// newFieldTree builds a tree from dotted paths such as
// "spec.template.spec.containers[].ports[].containerPort". A path ending in
// "{}" names an object that may only be empty: its set fields are reported
// one by one, at their own paths.
func newFieldTree(groups ...[]string) *fieldTree {
	root := &fieldTree{}
	for _, paths := range groups {
		for _, p := range paths {
			p, onlyEmpty := strings.CutSuffix(p, "{}")
			t := root
			for _, seg := range strings.Split(strings.ReplaceAll(p, "[]", ".[]"), ".") {
				if t.children == nil {
					t.children = make(map[string]*fieldTree)
				}
				next := t.children[seg]
				if next == nil {
					next = &fieldTree{}
					t.children[seg] = next
				}
				t = next
			}
			t.leaf = !onlyEmpty
		}
	}
	return root
}

// prefixed returns paths with prefix prepended.
func prefixed(prefix string, paths ...string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = prefix + p
	}
	return out
}

// serverOwnedMeta is the server-owned metadata: accepted so output of `kubectl get -o yaml` can be
// applied, and cleared by defaulting.
var serverOwnedMeta = []string{
	"metadata.uid", "metadata.resourceVersion", "metadata.creationTimestamp",
	"metadata.generation", "metadata.managedFields", "metadata.selfLink",
	"status",
}

var commonFields = []string{
	"apiVersion", "kind",
	"metadata.name", "metadata.namespace", "metadata.labels", "metadata.annotations",
}

var probeFields = []string{
	"exec.command",
	"httpGet.path", "httpGet.port", "httpGet.scheme", "httpGet.httpHeaders",
	"tcpSocket.port",
	"initialDelaySeconds", "timeoutSeconds", "periodSeconds",
	"successThreshold", "failureThreshold",
}

// hookFields are the lifecycle handler fields Starling runs (tcpSocket,
// which the kubelet no longer runs either, is refused).
var hookFields = []string{
	"exec.command",
	"httpGet.path", "httpGet.port", "httpGet.host", "httpGet.scheme", "httpGet.httpHeaders",
	"sleep.seconds",
}

var containerFields = concat(
	[]string{
		"name", "image", "command", "args", "workingDir",
		"env[].name", "env[].value", "env[].valueFrom.fieldRef.fieldPath", "env[].valueFrom.fieldRef.apiVersion",
		"env[].valueFrom.configMapKeyRef.name", "env[].valueFrom.configMapKeyRef.key", "env[].valueFrom.configMapKeyRef.optional",
		"env[].valueFrom.secretKeyRef.name", "env[].valueFrom.secretKeyRef.key", "env[].valueFrom.secretKeyRef.optional",
		"env[].valueFrom.resourceFieldRef.containerName", "env[].valueFrom.resourceFieldRef.resource", "env[].valueFrom.resourceFieldRef.divisor",
		"envFrom[].prefix", "envFrom[].configMapRef.name", "envFrom[].configMapRef.optional",
		"envFrom[].secretRef.name", "envFrom[].secretRef.optional",
		"ports[].name", "ports[].containerPort", "ports[].protocol",
		"resources.requests", "resources.limits",
		"imagePullPolicy",
		// Harmless: where the runtime looks for a termination message.
		"terminationMessagePath", "terminationMessagePolicy",
		"securityContext.runAsUser", "securityContext.runAsGroup", "securityContext.runAsNonRoot",
		"securityContext.readOnlyRootFilesystem", "securityContext.allowPrivilegeEscalation",
		"securityContext.capabilities.add", "securityContext.capabilities.drop",
		"securityContext.seccompProfile.type",
		// false is what kubectl prints; true is refused (validateContainerSecurity).
		"securityContext.privileged",
	},
	prefixed("lifecycle.postStart.", hookFields...),
	prefixed("lifecycle.preStop.", hookFields...),
	prefixed("readinessProbe.", probeFields...),
	prefixed("livenessProbe.", probeFields...),
	prefixed("startupProbe.", probeFields...),
)

// deploymentFields are the Deployment fields Starling implements or that
// cannot change behaviour. Any other field that is set is rejected, so a
// field added to k8s.io/api is refused until someone implements it.
var deploymentFields = newFieldTree(
	commonFields,
	serverOwnedMeta,
	[]string{
		"spec.replicas", "spec.selector.matchLabels",
		"spec.revisionHistoryLimit", "spec.progressDeadlineSeconds",
		"spec.minReadySeconds", "spec.paused",
		"spec.strategy.type",
		"spec.strategy.rollingUpdate.maxUnavailable", "spec.strategy.rollingUpdate.maxSurge",
	},
	podTemplateFields,
)

// podTemplateFields are the pod template fields Starling implements, for
// Deployments and StatefulSets alike.
var podTemplateFields = concat(
	[]string{
		"spec.template.metadata.labels", "spec.template.metadata.annotations",
		"spec.template.metadata.creationTimestamp",
		"spec.template.spec.terminationGracePeriodSeconds",
		"spec.template.spec.nodeSelector",
		"spec.template.spec.hostname", "spec.template.spec.subdomain",
		"spec.template.spec.hostAliases[].ip", "spec.template.spec.hostAliases[].hostnames",
		"spec.template.spec.dnsConfig.nameservers", "spec.template.spec.dnsConfig.searches",
		"spec.template.spec.dnsConfig.options[].name", "spec.template.spec.dnsConfig.options[].value",
		"spec.template.spec.restartPolicy",
		"spec.template.spec.dnsPolicy",
		"spec.template.spec.enableServiceLinks",
		"spec.template.spec.shareProcessNamespace",
		"spec.template.spec.imagePullSecrets[].name",
		// Harmless: Starling has one scheduler and no service accounts.
		"spec.template.spec.schedulerName",
		"spec.template.spec.serviceAccountName", "spec.template.spec.serviceAccount",
		"spec.template.spec.securityContext.runAsUser", "spec.template.spec.securityContext.runAsGroup",
		"spec.template.spec.securityContext.runAsNonRoot", "spec.template.spec.securityContext.seccompProfile.type",
		"spec.template.spec.securityContext.fsGroup", "spec.template.spec.securityContext.fsGroupChangePolicy",
	},
	prefixed("spec.template.spec.containers[].", containerFields...),
	prefixed("spec.template.spec.containers[].volumeMounts[].", volumeMountFields...),
	prefixed("spec.template.spec.initContainers[].", containerFields...),
	prefixed("spec.template.spec.initContainers[].volumeMounts[].", volumeMountFields...),
	[]string{"spec.template.spec.initContainers[].restartPolicy"},
	prefixed("spec.template.spec.volumes[].", volumeFields...),
)

// serviceFields are the Service fields Starling implements or that cannot
// change behaviour; see deploymentFields.
var serviceFields = newFieldTree(
	commonFields,
	serverOwnedMeta,
	[]string{
		"spec.type", "spec.selector", "spec.clusterIP", "spec.clusterIPs", "spec.externalName",
		"spec.ipFamilies", "spec.ipFamilyPolicy",
		"spec.internalTrafficPolicy", "spec.externalTrafficPolicy",
		"spec.sessionAffinity", "spec.loadBalancerIP",
		"spec.ports[].name", "spec.ports[].protocol", "spec.ports[].port",
		"spec.ports[].targetPort", "spec.ports[].nodePort",
	},
)

func concat(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// unsupportedFields returns a Forbidden error for every non-empty field of
// obj outside allowed, naming its exact path. obj is walked as its JSON
// form says it (the same shape users write: the names in its json tags,
// inline structs flattened, fields that omitempty or omitzero leave out
// skipped), by reflection, without encoding it.
func unsupportedFields(allowed *fieldTree, obj any) field.ErrorList {
	var errs field.ErrorList
	walkValue(allowed, reflect.ValueOf(obj), nil, &errs)
	return errs
}

var marshalerType = reflect.TypeFor[json.Marshaler]()

// asMarshaler returns v as a json.Marshaler when its type (or, for an
// addressable v, its pointer) encodes itself (metav1.Time,
// intstr.IntOrString, resource.Quantity): a scalar to this walk.
func asMarshaler(v reflect.Value) (json.Marshaler, bool) {
	if v.Kind() != reflect.Pointer && v.Kind() != reflect.Interface && v.Type().Implements(marshalerType) {
		return v.Interface().(json.Marshaler), true
	}
	if v.Kind() != reflect.Pointer && v.CanAddr() && v.Addr().Type().Implements(marshalerType) {
		return v.Addr().Interface().(json.Marshaler), true
	}
	return nil, false
}

// jsonField is how encoding/json writes one field of a struct type.
type jsonField struct {
	name      string
	index     []int // through embedded structs without a name, flattened as "inline" ones are
	omitEmpty bool
	omitZero  bool
}

// jsonFieldsOf caches the fields of struct types (reflect.Type ->
// []jsonField).
var jsonFieldsOf sync.Map

// fieldsOf returns how encoding/json writes struct type t's fields, sorted
// by name: "-" and unexported ones left out, names from the json tags.
func fieldsOf(t reflect.Type) []jsonField {
	if fs, ok := jsonFieldsOf.Load(t); ok {
		return fs.([]jsonField)
	}
	var fs []jsonField
	var add func(t reflect.Type, at []int)
	add = func(t reflect.Type, at []int) {
		for i := range t.NumField() {
			sf := t.Field(i)
			tag := sf.Tag.Get("json")
			if tag == "-" || (!sf.IsExported() && !sf.Anonymous) {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			index := append(slices.Clone(at), i)
			if sf.Anonymous && name == "" && sf.Type.Kind() == reflect.Struct {
				add(sf.Type, index)
				continue
			}
			if name == "" {
				name = sf.Name
			}
			fs = append(fs, jsonField{name: name, index: index, omitEmpty: hasOpt(opts, "omitempty"), omitZero: hasOpt(opts, "omitzero")})
		}
	}
	add(t, nil)
	slices.SortStableFunc(fs, func(a, b jsonField) int { return strings.Compare(a.name, b.name) })
	jsonFieldsOf.Store(t, fs)
	return fs
}

// written returns struct v's field f as encoding/json writes it, or false
// when it leaves it out (omitempty or omitzero, and empty).
func (f jsonField) written(v reflect.Value) (reflect.Value, bool) {
	fv := v.FieldByIndex(f.index)
	if f.omitEmpty && omitEmpty(fv) || f.omitZero && fv.IsZero() {
		return fv, false
	}
	return fv, true
}

func hasOpt(opts, o string) bool {
	for opt := range strings.SplitSeq(opts, ",") {
		if opt == o {
			return true
		}
	}
	return false
}

// omitEmpty reports whether encoding/json's omitempty leaves v out: false,
// 0, "", a nil pointer or interface, an empty slice, map or array.
func omitEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Interface, reflect.Pointer:
		return v.IsZero()
	}
	return false
}

// emptyValue reports whether v's JSON form says nothing (as encoding/json writes it): null,
// an empty list, or an object holding only empty values.
func emptyValue(v reflect.Value) bool {
	if !v.IsValid() {
		return true
	}
	if (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) && v.IsNil() {
		return true
	}
	if m, ok := asMarshaler(v); ok {
		b, err := m.MarshalJSON()
		return err == nil && string(b) == "null"
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		return emptyValue(v.Elem())
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if !emptyValue(it.Value()) {
				return false
			}
		}
		return true
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return v.IsNil() // base64: "" is a value
		}
		return v.Len() == 0
	case reflect.Struct:
		for _, f := range fieldsOf(v.Type()) {
			if fv, ok := f.written(v); ok && !emptyValue(fv) {
				return false
			}
		}
		return true
	}
	return false
}

// walkValue reports, below path, the non-empty fields of v that t does
// not allow, in the order of their JSON names.
// (An empty subtree reports nothing: every field below is empty.)
func walkValue(t *fieldTree, v reflect.Value, path *field.Path, errs *field.ErrorList) {
	if t.leaf || !v.IsValid() {
		return
	}
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	if _, ok := asMarshaler(v); ok {
		return // a scalar where the tree expects structure; nothing to report
	}
	child := func(k string) *field.Path {
		if path == nil {
			return field.NewPath(k)
		}
		return path.Child(k)
	}
	switch v.Kind() {
	case reflect.Struct:
		for _, f := range fieldsOf(v.Type()) {
			if fv, ok := f.written(v); ok {
				visitValue(t.children[f.name], fv, child(f.name), errs)
			}
		}
	case reflect.Map:
		byName := map[string]reflect.Value{}
		for it := v.MapRange(); it.Next(); {
			byName[it.Key().String()] = it.Value()
		}
		for _, k := range slices.Sorted(maps.Keys(byName)) {
			visitValue(t.children[k], byName[k], child(k), errs)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			visitValue(t.children["[]"], v.Index(i), path.Index(i), errs)
		}
	}
}

func visitValue(t *fieldTree, v reflect.Value, path *field.Path, errs *field.ErrorList) {
	if t == nil {
		if !emptyValue(v) {
			*errs = append(*errs, field.Forbidden(path, notSupportedYet))
		}
		return
	}
	walkValue(t, v, path, errs)
}
