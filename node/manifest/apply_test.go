package manifest

import (
	"testing"
	"time"
)

const applyDeployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web, uid: from-the-file, generation: 9}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: "img:v1"}]}
`

// Apply decides as an API server's strategies do: a new object gets the
// time and uid it is given and generation 1; applied again unchanged it
// stays as stored; changed, it keeps its uid and creation time and its
// generation counts up; after a delete (old nil) it is new again. What
// the file says of uid, creationTimestamp and generation counts for
// nothing.
func TestApplyDecidesCreatedConfiguredUnchanged(t *testing.T) {
	parse := func(y string) Object {
		objs, err := Parse([]byte(y), "test")
		if err != nil || len(objs) != 1 {
			t.Fatalf("parse: %v", err)
		}
		return objs[0]
	}
	t0 := time.Date(2026, 12, 6, 4, 0, 0, 500_000_000, time.UTC)
	obj := parse(applyDeployment)
	v1, res, err := Apply(nil, obj, t0, "uid-1")
	if err != nil || res != Created || v1 == nil {
		t.Fatalf("first apply: %q %v", res, err)
	}
	got, _ := Decode(v1)
	if m := got.Deployment.ObjectMeta; m.UID != "uid-1" || m.Generation != 1 || !m.CreationTimestamp.Time.Equal(t0.Truncate(time.Second)) {
		t.Fatalf("created: uid %q generation %d created %v", m.UID, m.Generation, m.CreationTimestamp)
	}
	if v, res, err := Apply(v1, parse(applyDeployment), t0.Add(time.Hour), "uid-2"); err != nil || res != Unchanged || v != nil {
		t.Fatalf("same file again: %q %v (value %d bytes)", res, err, len(v))
	}
	changed := parse(applyDeployment)
	changed.Deployment.Spec.Template.Spec.Containers[0].Image = "img:v2"
	v2, res, err := Apply(v1, changed, t0.Add(time.Hour), "uid-3")
	if err != nil || res != Configured {
		t.Fatalf("changed: %q %v", res, err)
	}
	got, _ = Decode(v2)
	if m := got.Deployment.ObjectMeta; m.UID != "uid-1" || m.Generation != 2 || !m.CreationTimestamp.Time.Equal(t0.Truncate(time.Second)) {
		t.Fatalf("configured: uid %q generation %d created %v", m.UID, m.Generation, m.CreationTimestamp)
	}
	if _, res, _ := Apply(nil, changed, t0.Add(2*time.Hour), "uid-4"); res != Created {
		t.Fatalf("after a delete: %q, want created", res)
	}
}
