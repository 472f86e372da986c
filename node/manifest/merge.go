package manifest

import (
	"encoding/json"
	"fmt"
	"maps"

	apivalidation "k8s.io/apimachinery/pkg/api/validation"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

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
