package node

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/test/harness"
)

func applyYAML(t *testing.T, n *testNode, y string) (int, string) {
	t.Helper()
	objs, err := manifest.Parse([]byte(y), "test")
	if err != nil {
		t.Fatal(err)
	}
	var req api.ApplyRequest
	for _, o := range objs {
		b, err := manifest.Encode(o)
		if err != nil {
			t.Fatal(err)
		}
		req.Objects = append(req.Objects, json.RawMessage(b))
	}
	return call(t, n, http.MethodPost, "/v1/apply", req, nil)
}

func serviceYAML(name, extra string) string {
	return "apiVersion: v1\nkind: Service\nmetadata: {name: " + name + "}\nspec:\n  type: NodePort\n  selector: {app: web}\n" + extra +
		"  ports: [{port: 80, targetPort: 8080}]\n"
}

// TestApplyBoundsAndServiceRangesFailClearlyAndStoreNothing: an object over
// the size limit, a ClusterIP outside --service-cidr or held by another
// Service, and a NodePort in use are refused with the object, the field
// and the fix; nothing is stored, and the Services already stored still
// list, with their allocated addresses in both clusterIP and clusterIPs.
func TestApplyBoundsAndServiceRangesFailClearlyAndStoreNothing(t *testing.T) {
	n := start(t, "a0", t.TempDir(), nil)
	if code, msg := applyYAML(t, n, serviceYAML("first", "  clusterIP: 10.23.0.10\n")); code != http.StatusOK {
		t.Fatalf("first Service: %d %s", code, msg)
	}
	var before api.ObjectList
	call(t, n, http.MethodGet, "/v1/objects/service", nil, &before)

	big := strings.Repeat("x", 100_000)
	var env []corev1.EnvVar
	for i := 0; i < 12; i++ {
		env = append(env, corev1.EnvVar{Name: "V" + string(rune('A'+i)), Value: big})
	}
	huge := harness.App{Name: "huge", Replicas: 1, Container: "c", Image: "img", Env: env}.Deployment()
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"object over 1 MiB", huge, []string{"Deployment default/huge: object is 1.1 MiB; the limit is 1.0 MiB"}},
		{"clusterIP outside the service range", serviceYAML("outside", "  clusterIP: 10.99.0.5\n"),
			[]string{"Service default/outside", "spec.clusterIP", "not in the valid range 10.23.0.0/16"}},
		{"clusterIP of another Service", serviceYAML("second", "  clusterIP: 10.23.0.10\n"),
			[]string{"spec.clusterIP", "already allocated to Service default/first"}},
		{"reserved clusterIP", serviceYAML("third", "  clusterIP: 10.23.255.255\n"), []string{"spec.clusterIP", "reserved"}},
		{"nodePort of another Service", strings.Replace(serviceYAML("fourth", ""), "targetPort: 8080", "targetPort: 8080, nodePort: 30080", 1) + "---\n" +
			strings.Replace(serviceYAML("fifth", ""), "targetPort: 8080", "targetPort: 8080, nodePort: 30080", 1),
			[]string{"Service default/fifth", "spec.ports[0].nodePort", "already allocated to Service default/fourth"}},
		{"LoadBalancer pool over the service CIDR", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lb-pool, namespace: starling-system}\ndata: {cidr: 10.23.1.0/28}\n",
			[]string{"configmap starling-system/lb-pool", "data[cidr]", "overlaps the cluster's 10.23.0.0/16"}},
		{"StatefulSet whose name is not one label", harness.App{Name: "db.v2", Replicas: 1, Container: "c", Image: "img"}.StatefulSet("db"),
			[]string{"StatefulSet default/db.v2", "metadata.name", "must be a DNS label, without dots"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := applyYAML(t, n, tc.yaml)
			if code != http.StatusUnprocessableEntity {
				t.Fatalf("status %d (%s), want 422", code, msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Fatalf("error %q lacks %q", msg, w)
				}
			}
			var after api.ObjectList
			if code, msg := call(t, n, http.MethodGet, "/v1/objects/service", nil, &after); code != http.StatusOK {
				t.Fatalf("list after a refused apply: %d %s", code, msg)
			}
			if b1, _ := json.Marshal(before); string(b1) != mustJSON(t, after) {
				t.Fatalf("stored Services changed:\n%s\n%s", b1, mustJSON(t, after))
			}
			if code, _ := call(t, n, http.MethodGet, "/v1/objects/deployment/default/huge", nil, nil); code != http.StatusNotFound {
				t.Fatalf("the oversized Deployment was stored (%d)", code)
			}
		})
	}
	// The listed Service decodes (clusterIP and clusterIPs agree).
	for _, it := range before.Items {
		o, err := manifest.Decode(it.Object)
		if err != nil {
			t.Fatalf("listed Service does not decode: %v", err)
		}
		if o.Service.Spec.ClusterIP != "10.23.0.10" {
			t.Fatalf("clusterIP = %q", o.Service.Spec.ClusterIP)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEnvOverTheKernelLimitIsRefused: one environment string over
// MAX_ARG_STRLEN would make every start fail with E2BIG; it is refused at
// apply with the field path.
func TestEnvOverTheKernelLimitIsRefused(t *testing.T) {
	y := harness.App{Name: "e", Replicas: 1, Container: "c", Image: "img", Env: harness.Env("BIG", strings.Repeat("y", 900<<10))}.Deployment()
	_, err := manifest.Parse([]byte(y), "x.yaml")
	if err == nil || !strings.Contains(err.Error(), "spec.template.spec.containers[0].env[0].value: Invalid value: \"<921605 bytes>\"") ||
		!strings.Contains(err.Error(), "MAX_ARG_STRLEN") {
		t.Fatalf("error = %v", err)
	}
}
