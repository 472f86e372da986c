// Package manifest decodes and validates Kubernetes-shaped manifests: the
// subset of apps/v1 Deployment and v1 Service that Starling runs.
//
// Objects are the real Kubernetes API types (k8s.io/api), decoded strictly
// (unknown and duplicate fields are errors), defaulted as the Kubernetes API
// server defaults them, and validated with Kubernetes' own field errors, so
// messages read like `kubectl apply` ones. Anything that would change
// behaviour but that Starling does not implement yet is rejected with
// `Forbidden: not supported by Starling yet` rather than silently ignored.
//
// Everything here is pure except ReadPaths, which reads files and stdin,
// and ReadKustomization, which reads a kustomization's files.
package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// KindOf maps a kind as users type it ("deployment", "deployments",
// "deploy", "service", "services", "svc", any case) to KindDeployment or
// KindService. Errors name the kinds there are.
func KindOf(s string) (string, error) {
	switch strings.ToLower(s) {
	case "deployment", "deployments", "deploy":
		return KindDeployment, nil
	case "service", "services", "svc":
		return KindService, nil
	case "statefulset", "statefulsets", "sts":
		return KindStatefulSet, nil
	case "configmap", "configmaps", "cm":
		return KindConfigMap, nil
	case "secret", "secrets":
		return KindSecret, nil
	case "persistentvolumeclaim", "persistentvolumeclaims", "pvc":
		return KindPersistentVolumeClaim, nil
	case "ingress", "ingresses", "ing":
		return KindIngress, nil
	}
	return "", fmt.Errorf("unknown kind %q: use deployment, statefulset, service, configmap, secret, pvc or ingress", s)
}

// MaxReplicas bounds spec.replicas: every node expands every Deployment
// into its replicas, so an absurd count must be refused at the door.
const MaxReplicas = 10000

// Kind names, as in the manifests' `kind` field.
const (
	KindDeployment = "Deployment"
	KindService    = "Service"
)

// DefaultNamespace is the namespace of objects that do not name one.
const DefaultNamespace = "default"

// Object is one decoded, defaulted manifest object.
type Object struct {
	Kind       string             // KindDeployment, KindStatefulSet, KindService, KindConfigMap, KindSecret, KindPersistentVolumeClaim or KindIngress
	Namespace  string             // defaulted to "default"
	Name       string             // metadata.name
	Deployment *appsv1.Deployment // set when Kind == KindDeployment (defaults applied)
	Service    *corev1.Service    // set when Kind == KindService (defaults applied)
	// StatefulSet is set when Kind == KindStatefulSet (defaults applied).
	StatefulSet *appsv1.StatefulSet
	// ConfigMap and Secret are set for their kinds (a Secret's
	// stringData merged into data).
	ConfigMap *corev1.ConfigMap
	Secret    *corev1.Secret
	// Claim is set for KindPersistentVolumeClaim (defaults applied).
	Claim *corev1.PersistentVolumeClaim
	// Ingress is set for KindIngress.
	Ingress *networkingv1.Ingress
	// Applied is the document as written, in JSON, before defaults
	// (Parse and ReadPaths set it): what an apply records (Record).
	Applied []byte
	// Ignored are the fields of the document the API server sets
	// ("status", "metadata.uid", ...), which Starling ignores and sets
	// itself (Parse and ReadPaths set it, for a warning).
	Ignored []string
}

// Key returns the store key "kind/namespace/name" with the kind lower-cased,
// e.g. "deployment/default/hello".
func (o Object) Key() string {
	return KeyFor(o.Kind, o.Namespace, o.Name)
}

// KeyFor builds the key Object.Key returns from its parts; an empty
// namespace means "default".
func KeyFor(kind, namespace, name string) string {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	return strings.ToLower(kind) + "/" + namespace + "/" + name
}

// Parse decodes every YAML or JSON document in data: "---"-separated YAML,
// or a stream of concatenated JSON objects when data starts with '{'. Empty
// documents are skipped and `apiVersion: v1, kind: List` documents are
// unpacked. Each object is defaulted and validated; two objects with the same
// Key are an error.
//
// source names the input in messages (a file name or "<stdin>"). On any
// problem Parse returns no objects and a *ValidationError listing every
// problem across all documents, one per line, e.g.
//
//	hello.yaml: Deployment "hello": spec.replicas: Invalid value: -1: must be greater than or equal to 0
func Parse(data []byte, source string) ([]Object, error) {
	items := parseInput(data, source)
	checkDuplicates(items)
	return finish(items)
}

// finish returns the objects of items, or the *ValidationError describing
// their problems.
func finish(items []item) ([]Object, error) {
	reports := make([]ObjectError, len(items))
	objs := make([]Object, 0, len(items))
	for i, it := range items {
		reports[i] = it.report
		objs = append(objs, it.obj)
	}
	if err := collect(reports); err != nil {
		return nil, err
	}
	return objs, nil
}

// manifestExts are the file name extensions ReadPaths picks from directories.
var manifestExts = map[string]bool{".yaml": true, ".yml": true, ".json": true}

// ReadPaths reads manifests from paths and parses them as Parse does. A path
// is a file (any name), a directory (its *.yaml, *.yml and *.json files in
// name order; with recursive, those of its subdirectories too, depth
// first in name order, as kubectl -R), or "-" for stdin. Problems in all inputs are
// collected; the returned error joins any I/O errors with a
// *ValidationError (find it with errors.As). Two objects with the same Key,
// even in different files, are an error.
func ReadPaths(paths []string, recursive bool, stdin io.Reader) ([]Object, error) {
	var (
		items  []item
		ioErrs []error
	)
	add := func(data []byte, source string) {
		items = append(items, parseInput(data, source)...)
	}
	for _, p := range paths {
		if p == "-" {
			if stdin == nil {
				ioErrs = append(ioErrs, errors.New("read <stdin>: no stdin"))
				continue
			}
			data, err := io.ReadAll(stdin)
			if err != nil {
				ioErrs = append(ioErrs, fmt.Errorf("read <stdin>: %w", err))
				continue
			}
			add(data, "<stdin>")
			continue
		}
		files, err := manifestFiles(p, recursive)
		if err != nil {
			ioErrs = append(ioErrs, err)
			continue
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				ioErrs = append(ioErrs, fmt.Errorf("read manifest: %w", err))
				continue
			}
			add(data, f)
		}
	}
	checkDuplicates(items)
	objs, err := finish(items)
	if len(ioErrs) > 0 {
		return nil, errors.Join(append(ioErrs, err)...)
	}
	return objs, err
}

// manifestFiles expands p into the files to read: p itself, or the manifest
// files inside it (directly, or at any depth when recursive).
func manifestFiles(p string, recursive bool) ([]string, error) {
	info, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	if !info.IsDir() {
		return []string{p}, nil
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, fmt.Errorf("read manifest directory: %w", err)
	}
	var files []string
	for _, e := range entries {
		if e.IsDir() && recursive {
			sub, err := manifestFiles(filepath.Join(p, e.Name()), true)
			if err != nil {
				return nil, err
			}
			files = append(files, sub...)
			continue
		}
		if e.IsDir() || !manifestExts[strings.ToLower(filepath.Ext(e.Name()))] {
			continue
		}
		files = append(files, filepath.Join(p, e.Name()))
	}
	return files, nil // in os.ReadDir's name order
}

// Encode returns the canonical JSON of o's Kubernetes object, with
// apiVersion and kind set, for storage and transport. The encoding is
// deterministic (struct field order, sorted map keys), so equal objects
// encode to equal bytes. It fails only if o is inconsistent (Kind does not
// match the object set).
func Encode(o Object) ([]byte, error) {
	switch o.Kind {
	case KindDeployment:
		if o.Deployment == nil {
			return nil, fmt.Errorf("encode %s: Deployment is nil", o.Key())
		}
		d := *o.Deployment
		d.TypeMeta.APIVersion, d.TypeMeta.Kind = "apps/v1", KindDeployment
		return json.Marshal(&d)
	case KindStatefulSet:
		if o.StatefulSet == nil {
			return nil, fmt.Errorf("encode %s: StatefulSet is nil", o.Key())
		}
		st := *o.StatefulSet
		st.TypeMeta.APIVersion, st.TypeMeta.Kind = "apps/v1", KindStatefulSet
		return json.Marshal(&st)
	case KindService:
		if o.Service == nil {
			return nil, fmt.Errorf("encode %s: Service is nil", o.Key())
		}
		s := *o.Service
		s.TypeMeta.APIVersion, s.TypeMeta.Kind = "v1", KindService
		return json.Marshal(&s)
	case KindConfigMap:
		if o.ConfigMap == nil {
			return nil, fmt.Errorf("encode %s: ConfigMap is nil", o.Key())
		}
		c := *o.ConfigMap
		c.TypeMeta.APIVersion, c.TypeMeta.Kind = "v1", KindConfigMap
		return json.Marshal(&c)
	case KindSecret:
		if o.Secret == nil {
			return nil, fmt.Errorf("encode %s: Secret is nil", o.Key())
		}
		sec := *o.Secret
		sec.TypeMeta.APIVersion, sec.TypeMeta.Kind = "v1", KindSecret
		return json.Marshal(&sec)
	case KindPersistentVolumeClaim:
		if o.Claim == nil {
			return nil, fmt.Errorf("encode %s: Claim is nil", o.Key())
		}
		c := *o.Claim
		c.TypeMeta.APIVersion, c.TypeMeta.Kind = "v1", KindPersistentVolumeClaim
		return json.Marshal(&c)
	case KindIngress:
		if o.Ingress == nil {
			return nil, fmt.Errorf("encode %s: Ingress is nil", o.Key())
		}
		in := *o.Ingress
		in.TypeMeta.APIVersion, in.TypeMeta.Kind = "networking.k8s.io/v1", KindIngress
		return json.Marshal(&in)
	default:
		return nil, fmt.Errorf("encode %s: unsupported kind %q", o.Key(), o.Kind)
	}
}

// Decode parses one object stored by Encode: a single JSON object, decoded
// strictly (unknown or duplicate fields, trailing data and YAML are errors),
// defaulted and validated. It is meant for data from disk or the network and
// never panics. Problems are returned as a *ValidationError.
func Decode(data []byte) (Object, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return Object{}, &ValidationError{Objects: []ObjectError{{
			Decoding: []error{fmt.Errorf("want a JSON object, got %s", jsonKind(trimmed))},
		}}}
	}
	items := decodeDocument(trimmed, ObjectError{}, false)
	objs, err := finish(items)
	if err != nil {
		return Object{}, err
	}
	if len(objs) != 1 {
		// Unreachable: without Lists a document holds one object.
		return Object{}, fmt.Errorf("decode: got %d objects, want 1", len(objs))
	}
	objs[0].Applied, objs[0].Ignored = nil, nil // an encoded object, not a document as written
	// Stored objects keep the metadata the agent set (Parse clears it from
	// user input): its UID, when the object was created, and its
	// generation.
	var stored struct {
		Metadata struct {
			UID               types.UID   `json:"uid"`
			CreationTimestamp metav1.Time `json:"creationTimestamp"`
			Generation        int64       `json:"generation"`
		} `json:"metadata"`
	}
	if json.Unmarshal(trimmed, &stored) == nil {
		o := objs[0]
		m := metaOf(&o)
		m.CreationTimestamp, m.Generation = stored.Metadata.CreationTimestamp, stored.Metadata.Generation
		// A UID is a token the agent made; anything else is not kept.
		if uid := stored.Metadata.UID; len(uid) <= 64 && validation.IsQualifiedName(string(uid)) == nil {
			m.UID = uid
		}
	}
	return objs[0], nil
}

// Results of an apply, as kubectl prints them.
const (
	Created    = "created"
	Configured = "configured"
	Unchanged  = "unchanged"
)

// Apply decides how obj is stored over old, the encoded object stored
// under its key (nil: none, or a tombstone), as a Kubernetes API
// server's create and update strategies do: the uid and
// creationTimestamp the API server sets are kept from old (an object
// stored before Starling gave UIDs keeps none: a new one would rename
// its replicas); a new object gets now (to the second, UTC) and uid;
// generation counts changes of the object. It returns the value to
// store (nil when unchanged) and Created, Configured or Unchanged. obj's
// own uid, creationTimestamp and generation are ignored. A pure
// function: the clock and the uid are given.
func Apply(old []byte, obj Object, now time.Time, uid types.UID) (value []byte, result string, err error) {
	meta := metaOf(&obj)
	meta.CreationTimestamp, meta.Generation, meta.UID = metav1.Time{}, 0, ""
	result = Created
	if old != nil {
		result = Configured
		if prev, err := Decode(old); err == nil {
			if errs := ValidateUpdate(prev, obj); len(errs) > 0 {
				return nil, "", &ValidationError{Objects: []ObjectError{{Kind: obj.Kind, Name: obj.Name, Errs: errs}}}
			}
			pm := metaOf(&prev)
			meta.CreationTimestamp, meta.Generation, meta.UID = pm.CreationTimestamp, pm.Generation, pm.UID
		}
		same, err := Encode(obj)
		if err != nil {
			return nil, "", err
		}
		if bytes.Equal(old, same) {
			return nil, Unchanged, nil
		}
	}
	if meta.CreationTimestamp.IsZero() {
		meta.CreationTimestamp = metav1.NewTime(now.UTC().Truncate(time.Second))
	}
	if result == Created {
		// A new object, also one applied again after a delete: its
		// replicas are not its predecessor's (reconcile.NewReplica).
		meta.UID = uid
	}
	meta.Generation++
	value, err = Encode(obj)
	return value, result, err
}

// metaOf is the object metadata of o's kind.
func metaOf(o *Object) *metav1.ObjectMeta {
	switch {
	case o.Deployment != nil:
		return &o.Deployment.ObjectMeta
	case o.StatefulSet != nil:
		return &o.StatefulSet.ObjectMeta
	case o.ConfigMap != nil:
		return &o.ConfigMap.ObjectMeta
	case o.Secret != nil:
		return &o.Secret.ObjectMeta
	case o.Claim != nil:
		return &o.Claim.ObjectMeta
	case o.Ingress != nil:
		return &o.Ingress.ObjectMeta
	}
	return &o.Service.ObjectMeta
}

// LastAppliedAnnotation is where an apply records the configuration it
// applied (kubectl's annotation), for the next apply's three-way merge.
const LastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// Merge returns what an apply of obj over prev (the stored object's
// encoding; nil: none) stores, by kubectl's client-side apply: a
// three-way strategic merge (k8s.io/apimachinery's strategicpatch) of
// the configuration the last apply recorded, obj, and prev. A field the
// files never set keeps what another command set (a rollout restart's
// annotation, a scale's replicas); a field the last file set and obj
// does not is removed. obj's configuration is recorded in
// LastAppliedAnnotation (not for a Secret, whose annotations are not
// sealed: a Secret is replaced whole; nor a configuration over the
// annotations' size limit). With no recorded configuration obj replaces
// prev. Errors are obj's that the merge brings out, as a
// *ValidationError.
func Merge(prev []byte, obj Object) (Object, error) {
	if obj.Kind == KindSecret {
		return obj, nil
	}
	// The configuration as written (Record), else as decoded (with its
	// defaults: a field the file left to its default is then the file's).
	modified := []byte(metaOf(&obj).Annotations[LastAppliedAnnotation])
	delete(metaOf(&obj).Annotations, LastAppliedAnnotation)
	if len(modified) == 0 {
		var err error
		if modified, err = Encode(obj); err != nil {
			return obj, err
		}
	}
	var last string
	var current []byte
	if prev != nil {
		if p, err := Decode(prev); err == nil && p.Kind == obj.Kind {
			pm := metaOf(&p)
			last = pm.Annotations[LastAppliedAnnotation]
			delete(pm.Annotations, LastAppliedAnnotation)
			current, _ = Encode(p)
		}
	}
	if last != "" && current != nil {
		schema, err := strategicpatch.NewPatchMetaFromStruct(schemaOf(obj.Kind))
		if err != nil {
			return obj, err
		}
		patch, err := strategicpatch.CreateThreeWayMergePatch([]byte(last), modified, current, schema, true)
		if err != nil {
			return obj, fmt.Errorf("merge %s with what is stored: %w", obj.Key(), err)
		}
		merged, err := strategicpatch.StrategicMergePatchUsingLookupPatchMeta(current, patch, schema)
		if err != nil {
			return obj, fmt.Errorf("merge %s with what is stored: %w", obj.Key(), err)
		}
		if obj, err = Decode(merged); err != nil {
			return obj, err
		}
	}
	m := metaOf(&obj)
	recorded := maps.Clone(m.Annotations)
	if recorded == nil {
		recorded = map[string]string{}
	}
	recorded[LastAppliedAnnotation] = string(modified)
	// A configuration too large for the annotations' 256 KiB is not
	// recorded (kubectl fails the apply instead): the next apply then
	// replaces the object whole.
	if len(validateAnnotations(recorded, field.NewPath("metadata", "annotations"))) == 0 {
		m.Annotations = recorded
	}
	return obj, nil
}

// schemaOf is the Go type of kind, whose struct tags say how lists merge
// (their patch strategy and merge key).
func schemaOf(kind string) any {
	switch kind {
	case KindDeployment:
		return appsv1.Deployment{}
	case KindStatefulSet:
		return appsv1.StatefulSet{}
	case KindService:
		return corev1.Service{}
	case KindPersistentVolumeClaim:
		return corev1.PersistentVolumeClaim{}
	case KindIngress:
		return networkingv1.Ingress{}
	}
	return corev1.ConfigMap{}
}

// Record returns o with the document it was read from (o.Applied, its
// own LastAppliedAnnotation taken out) recorded in
// LastAppliedAnnotation, as kubectl apply sends an object: the server's
// Merge then tells the fields the file sets from those it leaves to
// defaults and to other commands. A Secret is returned as it is.
func Record(o Object) Object {
	if o.Kind == KindSecret || len(o.Applied) == 0 {
		return o
	}
	var doc map[string]any
	if json.Unmarshal(o.Applied, &doc) != nil {
		return o
	}
	if meta, ok := doc["metadata"].(map[string]any); ok {
		if ann, ok := meta["annotations"].(map[string]any); ok {
			delete(ann, LastAppliedAnnotation)
			if len(ann) == 0 {
				delete(meta, "annotations")
			}
		}
	}
	b, err := json.Marshal(doc)
	if err != nil || len(b) > apivalidation.TotalAnnotationSizeLimitB {
		return o // too large to record (Merge)
	}
	m := metaOf(&o)
	m.Annotations = maps.Clone(m.Annotations)
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[LastAppliedAnnotation] = string(b)
	return o
}
