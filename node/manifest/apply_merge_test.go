package manifest

import (
	"strings"
	"testing"
	"time"
)

// TestApplyKeepsWhatOtherCommandsSet: kubectl's apply semantics. A
// rollout restart (a template annotation) and a scale (replicas) made
// between two applies of the same file survive the second apply, which
// stores nothing new; a field the file drops is removed; a Secret is
// replaced whole and records no configuration in clear.
func TestApplyKeepsWhatOtherCommandsSet(t *testing.T) {
	now := time.Unix(1e9, 0)
	file := goodDeployment // no replicas: a scale's stay
	apply := func(stored []byte, doc string) ([]byte, string) {
		t.Helper()
		obj, err := Merge(stored, Record(parseOne(t, doc)))
		if err != nil {
			t.Fatal(err)
		}
		value, result, err := Apply(stored, obj, now, "uid-1")
		if err != nil {
			t.Fatal(err)
		}
		if value == nil {
			return stored, result
		}
		return value, result
	}
	stored, res := apply(nil, file)
	if res != Created {
		t.Fatal(res)
	}
	o, _ := Decode(stored)
	if o.Deployment.Annotations[LastAppliedAnnotation] == "" {
		t.Fatal("no configuration recorded")
	}
	// Other commands edit what is stored (scale, rollout restart).
	o.Deployment.Spec.Replicas = ptr[int32](5)
	o.Deployment.Spec.Template.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-12-06T10:00:00Z"}
	stored, _, _ = Apply(stored, o, now, "")
	if _, res = apply(stored, file); res != Unchanged {
		t.Fatalf("the same file again: %s, want unchanged", res)
	}
	// The file changes its image: the scale and the restart stay.
	changed := strings.Replace(file, "image: nginx:1.27", "image: nginx:1.28", 1)
	stored, res = apply(stored, changed)
	o, _ = Decode(stored)
	if res != Configured || o.Deployment.Spec.Template.Spec.Containers[0].Image != "nginx:1.28" || *o.Deployment.Spec.Replicas != 5 ||
		o.Deployment.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] == "" {
		t.Fatalf("%s: image %s replicas %d annotations %v", res, o.Deployment.Spec.Template.Spec.Containers[0].Image, *o.Deployment.Spec.Replicas, o.Deployment.Spec.Template.Annotations)
	}
	// The file drops its env var: gone from what is stored.
	if !strings.Contains(changed, "        env:\n        - name: GREETING\n          value: hi\n") {
		t.Fatal("test manifest changed shape")
	}
	dropped := strings.Replace(changed, "        env:\n        - name: GREETING\n          value: hi\n", "", 1)
	stored, _ = apply(stored, dropped)
	o, _ = Decode(stored)
	if len(o.Deployment.Spec.Template.Spec.Containers[0].Env) != 0 {
		t.Fatalf("a field the file dropped stays: %v", o.Deployment.Spec.Template.Spec.Containers[0].Env)
	}
	// A Secret: replaced whole, no configuration recorded.
	s, err := Merge(nil, parseOne(t, goodSecret))
	if err != nil || s.Secret.Annotations[LastAppliedAnnotation] != "" {
		t.Fatalf("Secret: %v %v", s.Secret.Annotations, err)
	}
}

// TestApplyOfAConfigurationTooLargeToRecord: a ConfigMap of 300 KiB, whose
// configuration does not fit the annotations' 256 KiB, is applied (not
// refused, as kubectl refuses it) and records nothing; the same file
// again is unchanged.
func TestApplyOfAConfigurationTooLargeToRecord(t *testing.T) {
	doc := strings.Replace(goodConfigMap, "MODE: fast", "MODE: "+strings.Repeat("x", 300<<10), 1)
	obj, err := Merge(nil, Record(parseOne(t, doc)))
	if err != nil || obj.ConfigMap.Annotations[LastAppliedAnnotation] != "" {
		t.Fatalf("%v, recorded %d bytes", err, len(obj.ConfigMap.Annotations[LastAppliedAnnotation]))
	}
	stored, _, err := Apply(nil, obj, time.Unix(1e9, 0), "u")
	if err != nil {
		t.Fatal(err)
	}
	again, err := Merge(stored, Record(parseOne(t, doc)))
	if err != nil {
		t.Fatal(err)
	}
	if _, res, err := Apply(stored, again, time.Unix(1e9, 0), "u"); err != nil || res != Unchanged {
		t.Fatalf("the same file again: %s %v", res, err)
	}
}
