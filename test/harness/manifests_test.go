package harness

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/manifest"
)

// TestManifestsAreValidStarlingInput: what the builder writes parses and
// validates as the agent would take it, with the fields the tests set.
func TestManifestsAreValidStarlingInput(t *testing.T) {
	web := App{Name: "web", Namespace: "ns1", Replicas: 3, Grace: Seconds(0), Ports: HTTPPort,
		Readiness: HTTPProbe("/healthz", 1), Env: Env("A", "1"), Limits: Limits("memory", "64Mi")}
	yaml := Manifests(web.Deployment(), web.Service("web", []corev1.ServicePort{ServicePort(80, "http")}),
		web.StatefulSet("web", func(s *appsv1.StatefulSet) { s.Name = "db" }))
	objs, err := manifest.Parse([]byte(yaml), "test")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 3 {
		t.Fatalf("%d objects, want 3:\n%s", len(objs), yaml)
	}
	for _, o := range objs {
		if errs := manifest.Validate(o); len(errs) > 0 {
			t.Errorf("%v:\n%s", errs.ToAggregate(), yaml)
		}
	}
	d := objs[0].Deployment
	if d == nil {
		t.Fatalf("first object is a %s", objs[0].Kind)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if objs[0].Namespace != "ns1" || *d.Spec.Replicas != 3 || *d.Spec.Template.Spec.TerminationGracePeriodSeconds != 0 ||
		c.Image != EchoImage || c.ReadinessProbe.HTTPGet.Port.StrVal != "http" || c.Env[0].Value != "1" || c.Resources.Limits.Memory().String() != "64Mi" {
		t.Errorf("the Deployment lost a field:\n%s", yaml)
	}
	if s := objs[1].Service; s == nil || s.Spec.Ports[0].TargetPort.StrVal != "http" || s.Spec.Selector["app"] != "web" {
		t.Errorf("the Service lost a field:\n%s", yaml)
	}
}
