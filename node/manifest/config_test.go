package manifest

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

const goodConfigMap = `apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
data:
  app.properties: |
    color=blue
  MODE: fast
binaryData:
  logo.png: iVBORw0K
`

const goodSecret = `apiVersion: v1
kind: Secret
metadata:
  name: db
type: Opaque
data:
  password: czNjcjN0
stringData:
  user: admin
  password: overridden
`

func parseOne(t *testing.T, doc string) Object {
	t.Helper()
	objs, err := Parse([]byte(doc), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 {
		t.Fatalf("got %d objects", len(objs))
	}
	return objs[0]
}

func TestConfigMapAndSecretDecodeAsTheAPIServerStoresThem(t *testing.T) {
	cm := parseOne(t, goodConfigMap)
	if cm.Kind != KindConfigMap || cm.Namespace != "default" || cm.ConfigMap.Data["MODE"] != "fast" || len(cm.ConfigMap.BinaryData["logo.png"]) == 0 {
		t.Fatalf("configmap: %+v", cm.ConfigMap)
	}
	sec := parseOne(t, goodSecret)
	s := sec.Secret
	// stringData is merged over data and cleared, as the API server does.
	if s.Type != corev1.SecretTypeOpaque || string(s.Data["password"]) != "overridden" || string(s.Data["user"]) != "admin" || s.StringData != nil {
		t.Fatalf("secret: type %q data %q stringData %v", s.Type, s.Data, s.StringData)
	}
	// Round trip through the store's encoding.
	for _, o := range []Object{cm, sec} {
		b, err := Encode(o)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := Encode(back)
		if string(again) != string(b) {
			t.Fatalf("%s does not round-trip:\n%s\n%s", o.Key(), b, again)
		}
	}
	if k, err := KindOf("cm"); err != nil || k != KindConfigMap {
		t.Fatal(k, err)
	}
	if k, err := KindOf("Secrets"); err != nil || k != KindSecret {
		t.Fatal(k, err)
	}
}

func TestConfigMapAndSecretProblemsNameTheField(t *testing.T) {
	r := strings.Replace
	big := strings.Repeat("x", MaxDataBytes)
	cases := []struct{ name, doc, want string }{
		{"bad key", r(goodConfigMap, "MODE: fast", "bad/key: fast", 1), `data[bad/key]: Invalid value: "bad/key"`},
		{"key in both", r(goodConfigMap, "  MODE: fast", "  logo.png: x", 1), "binaryData[logo.png]: Invalid value: \"logo.png\": duplicate of key present in data"},
		{"too big", r(goodConfigMap, "MODE: fast", "MODE: "+big, 1), "data: Too long: may not be more than 1048576 bytes"},
		{"tls without key", "apiVersion: v1\nkind: Secret\nmetadata: {name: t}\ntype: kubernetes.io/tls\ndata: {tls.crt: eA==}\n", "data[tls.key]: Required value: a kubernetes.io/tls Secret holds tls.key"},
		{"basic-auth empty", "apiVersion: v1\nkind: Secret\nmetadata: {name: t}\ntype: kubernetes.io/basic-auth\n", "data: Required value: a kubernetes.io/basic-auth Secret holds username or password"},
		{"dockerconfigjson not json", "apiVersion: v1\nkind: Secret\nmetadata: {name: t}\ntype: kubernetes.io/dockerconfigjson\nstringData: {.dockerconfigjson: '{'}\n", "data[.dockerconfigjson]: Invalid value: \"<secret contents redacted>\": must be valid JSON"},
		{"token", "apiVersion: v1\nkind: Secret\nmetadata: {name: t}\ntype: kubernetes.io/service-account-token\n", "type: Forbidden: not supported by Starling yet"},
		{"bad type", "apiVersion: v1\nkind: Secret\nmetadata: {name: t}\ntype: 'no good'\n", `type: Invalid value: "no good"`},
		{"unknown field", r(goodSecret, "type: Opaque", "type: Opaque\nfoo: bar", 1), `unknown field "foo"`},
		{"bad name", r(goodConfigMap, "name: app-config", "name: App_Config", 1), `metadata.name: Invalid value: "App_Config"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.doc), "t.yaml")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v\nwant it to contain %q", err, c.want)
			}
			if strings.Contains(err.Error(), "czNjcjN0") || strings.Contains(err.Error(), "s3cr3t") {
				t.Fatalf("an error repeats a secret value: %v", err)
			}
		})
	}
	// Helm keeps releases in Secrets of its own type.
	parseOne(t, "apiVersion: v1\nkind: Secret\nmetadata: {name: sh.helm.release.v1.x.v1}\ntype: helm.sh/release.v1\ndata: {release: eA==}\n")
}

func TestImmutableConfigurationRefusesChanges(t *testing.T) {
	now := time.Unix(1e9, 0)
	cm := parseOne(t, strings.Replace(goodConfigMap, "\ndata:", "\nimmutable: true\ndata:", 1))
	old, _, err := Apply(nil, cm, now, "u1")
	if err != nil {
		t.Fatal(err)
	}
	same := parseOne(t, strings.Replace(goodConfigMap, "\ndata:", "\nimmutable: true\ndata:", 1))
	if _, res, err := Apply(old, same, now, "u2"); err != nil || res != Unchanged {
		t.Fatalf("same immutable ConfigMap: %s %v", res, err)
	}
	changed := parseOne(t, strings.Replace(goodConfigMap, "data:\n  app.properties", "immutable: true\ndata:\n  other: x\n  app.properties", 1))
	_, _, err = Apply(old, changed, now, "u2")
	var ve *ValidationError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "data: Forbidden: field is immutable when `immutable` is set") {
		t.Fatalf("changed immutable ConfigMap: %v", err)
	}
	mutable := parseOne(t, goodConfigMap)
	if _, _, err = Apply(old, mutable, now, "u2"); err == nil || !strings.Contains(err.Error(), "immutable: Forbidden") {
		t.Fatalf("immutable unset: %v", err)
	}
	// A Secret's type never changes.
	s := parseOne(t, goodSecret)
	olds, _, _ := Apply(nil, s, now, "u1")
	tls := parseOne(t, "apiVersion: v1\nkind: Secret\nmetadata: {name: db}\ntype: kubernetes.io/tls\ndata: {tls.crt: eA==, tls.key: eA==}\n")
	if _, _, err := Apply(olds, tls, now, "u2"); err == nil || !strings.Contains(err.Error(), "type: Invalid value") {
		t.Fatalf("type changed: %v", err)
	}
	if got := DataSizes(s); got["password"] != len("overridden") || got["user"] != 5 {
		t.Fatalf("sizes %v", got)
	}
}

// TestResourceFieldRefIsChecked: a container's own requests and limits
// with the divisors Kubernetes allows; another container or a divisor
// of the wrong kind is refused by path.
func TestResourceFieldRefIsChecked(t *testing.T) {
	dep := func(ref string) string {
		return workloadYAML("Deployment", "app", "      containers:\n      - name: app\n        image: app\n        env: [{name: V, valueFrom: {resourceFieldRef: "+ref+"}}]\n")
	}
	for _, ok := range []string{"{resource: limits.cpu}", "{resource: limits.memory, divisor: 1Mi}", "{containerName: app, resource: requests.cpu, divisor: 1m}"} {
		if _, err := Parse([]byte(dep(ok)), "d.yaml"); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for ref, want := range map[string]string{
		"{containerName: other, resource: limits.cpu}": "resourceFieldRef.containerName: Not found: \"other\"",
		"{resource: limits.cpu, divisor: 1Mi}":         "resourceFieldRef.divisor: Unsupported value",
		"{resource: limits.memory, divisor: 3}":        "resourceFieldRef.divisor: Unsupported value",
	} {
		if _, err := Parse([]byte(dep(ref)), "d.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", ref, err, want)
		}
	}
	// A downwardAPI volume's file of a resource names its container.
	vol := func(ref string) string {
		return workloadYAML("Deployment", "app", "      containers:\n      - name: app\n        image: app\n      - name: log\n        image: app\n"+
			"      volumes: [{name: info, downwardAPI: {items: [{path: mem, resourceFieldRef: "+ref+"}]}}]\n")
	}
	if _, err := Parse([]byte(vol("{containerName: log, resource: limits.memory, divisor: 1Mi}")), "d.yaml"); err != nil {
		t.Errorf("a downwardAPI file of another container's limit: %v", err)
	}
	for ref, want := range map[string]string{
		"{resource: limits.memory}":                    "volumes[0].downwardAPI.items[0].resourceFieldRef.containerName: Required value",
		"{containerName: db, resource: limits.memory}": "volumes[0].downwardAPI.items[0].resourceFieldRef.containerName: Not found: \"db\"",
		"{containerName: log, resource: limits.gpu}":   "volumes[0].downwardAPI.items[0].resourceFieldRef.resource: Unsupported value",
	} {
		if _, err := Parse([]byte(vol(ref)), "d.yaml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("downwardAPI %s: %v, want %q", ref, err, want)
		}
	}
}
