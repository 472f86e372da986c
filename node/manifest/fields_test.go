package manifest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsyaml "sigs.k8s.io/yaml"
)

// unsupportedFieldsJSON is unsupportedFields as it was first written: obj
// encoded to JSON, decoded into maps and walked. The reflection walk must
// say exactly what it says.
func unsupportedFieldsJSON(allowed *fieldTree, obj any) field.ErrorList {
	js, err := json.Marshal(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	var v any
	if err := json.Unmarshal(js, &v); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	var errs field.ErrorList
	walkFields(allowed, v, nil, &errs)
	return errs
}

func walkFields(t *fieldTree, v any, path *field.Path, errs *field.ErrorList) {
	if t.leaf || isEmpty(v) {
		return
	}
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			var p *field.Path
			if path == nil {
				p = field.NewPath(k)
			} else {
				p = path.Child(k)
			}
			visit(t.children[k], v[k], p, errs)
		}
	case []any:
		for i, e := range v {
			visit(t.children["[]"], e, path.Index(i), errs)
		}
	}
}

func visit(t *fieldTree, v any, path *field.Path, errs *field.ErrorList) {
	if t == nil {
		if !isEmpty(v) {
			*errs = append(*errs, field.Forbidden(path, notSupportedYet))
		}
		return
	}
	walkFields(t, v, path, errs)
}

// isEmpty reports whether a JSON value says nothing: null, an empty list,
// or an object holding only empty values. `securityContext: {}` is empty; `false`
// and `0` are not, since for pointer fields they are explicit choices.
func isEmpty(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case map[string]any:
		for _, e := range v {
			if !isEmpty(e) {
				return false
			}
		}
		return true
	case []any:
		// A list element is an explicit entry even when all its fields are
		// empty (`tolerations: [{}]` tolerates everything).
		return len(v) == 0
	default:
		return false
	}
}

// sameUnsupported fails when the two walks of obj disagree.
func sameUnsupported(t *testing.T, allowed *fieldTree, obj any) {
	t.Helper()
	got, want := unsupportedFields(allowed, obj), unsupportedFieldsJSON(allowed, obj)
	if len(got) != len(want) {
		t.Fatalf("reflection walk says %v\nJSON walk says %v", got, want)
	}
	for i := range got {
		if got[i].Error() != want[i].Error() {
			t.Fatalf("reflection walk says %v\nJSON walk says %v", got, want)
		}
	}
}

// sameUnsupportedOf decodes data (YAML or JSON, not checked) as each kind
// and compares the two walks on what decodes.
func sameUnsupportedOf(t *testing.T, data []byte) {
	var d appsv1.Deployment
	if sigsyaml.Unmarshal(data, &d) == nil {
		sameUnsupported(t, deploymentFields, &d)
	}
	var st appsv1.StatefulSet
	if sigsyaml.Unmarshal(data, &st) == nil {
		sameUnsupported(t, statefulSetFields, &st)
	}
	var svc corev1.Service
	if sigsyaml.Unmarshal(data, &svc) == nil {
		sameUnsupported(t, serviceFields, &svc)
	}
}

// The reflection walk that refuses unsupported fields reports what the
// JSON walk did, field for field and in the same order, over every
// manifest of the examples and tests and over fuzzed input (objects with
// fields Starling does not implement, empty objects, explicit zeros).
func FuzzUnsupportedFieldsAgree(f *testing.F) {
	for _, dir := range []string{"../../examples", "testdata"} {
		paths, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		for _, p := range paths {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	for _, s := range []string{
		`{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"i","volumeMounts":[{"name":"v","mountPath":"/x"}],"ports":[{"containerPort":0}]}],"volumes":[{"name":"v","emptyDir":{}}],"securityContext":{},"affinity":{"nodeAffinity":{}}}}}}`,
		`{"metadata":{"name":"x","creationTimestamp":null,"finalizers":["a"],"ownerReferences":[{}]},"spec":{"replicas":0,"paused":false,"strategy":{}},"status":{"replicas":3}}`,
		`{"spec":{"type":"LoadBalancer","loadBalancerIP":"1.2.3.4","ports":[{"port":80,"targetPort":"http","appProtocol":"h2"}],"sessionAffinityConfig":{"clientIP":{}}}}`,
		`{"spec":{"template":{"spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":"1"},"claims":[{"name":"x"}]},"env":[{"name":"A","valueFrom":{"secretKeyRef":{"name":"s","key":"k"}}}]}],"tolerations":[{}]}}}}`,
		`{"spec":{"volumeClaimTemplates":[{"metadata":{"name":"d"}}],"serviceName":"s","template":{"spec":{"containers":[]}}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { sameUnsupportedOf(t, data) })
}

// The check of unsupported fields on a Deployment as users write it,
// by reflection and by the JSON round trip it replaced:
//
//	go test ./node/manifest -run '^$' -bench UnsupportedFields -benchmem
func BenchmarkUnsupportedFields(b *testing.B) {
	var d appsv1.Deployment
	if err := sigsyaml.Unmarshal([]byte(`apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  strategy: {rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: web
        image: nginx:1.22
        env: [{name: A, value: "1"}, {name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
        ports: [{name: http, containerPort: 80}]
        resources: {limits: {memory: 64Mi, cpu: 250m}}
        readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1}
`), &d); err != nil {
		b.Fatal(err)
	}
	for _, w := range []struct {
		name string
		f    func(*fieldTree, any) field.ErrorList
	}{{"reflection", unsupportedFields}, {"json", unsupportedFieldsJSON}} {
		b.Run(w.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if errs := w.f(deploymentFields, &d); len(errs) != 0 {
					b.Fatal(errs)
				}
			}
		})
	}
}
