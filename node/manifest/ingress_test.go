package manifest

import (
	"strings"
	"testing"
	"time"
)

const goodIngress = `apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  annotations: {nginx.ingress.kubernetes.io/proxy-body-size: 8m}
spec:
  ingressClassName: nginx
  defaultBackend: {service: {name: web, port: {number: 80}}}
  tls: [{hosts: [shop.example.com], secretName: shop-tls}]
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
  - host: "*.example.com"
    http:
      paths:
      - {path: /api, pathType: Exact, backend: {service: {name: api, port: {number: 8080}}}}
`

// TestAnIngressIsAppliedAndStoredAsWritten: an Ingress decodes, is
// applied (recorded, merged, stored) and decodes back the same; a served
// annotation (BackendsAnnotation) is never stored.
func TestAnIngressIsAppliedAndStoredAsWritten(t *testing.T) {
	obj := parseOne(t, strings.Replace(goodIngress, "annotations: {", "annotations: {starling.dev/backends: x, ", 1))
	if obj.Kind != KindIngress || obj.Namespace != DefaultNamespace || obj.Ingress.Annotations[BackendsAnnotation] != "" {
		t.Fatalf("decoded %+v", obj)
	}
	merged, err := Merge(nil, Record(obj))
	if err != nil {
		t.Fatal(err)
	}
	value, result, err := Apply(nil, merged, time.Unix(1e9, 0), "uid-1")
	if err != nil || result != Created {
		t.Fatalf("apply: %v %s", err, result)
	}
	back, err := Decode(value)
	if err != nil {
		t.Fatal(err)
	}
	if back.Key() != "ingress/default/shop" || len(back.Ingress.Spec.Rules) != 2 || back.Ingress.Spec.TLS[0].SecretName != "shop-tls" {
		t.Fatalf("stored %s", value)
	}
	if n, err := BodyBytes(back.Ingress.Annotations[BodySizeAnnotation]); err != nil || n != 8<<20 {
		t.Errorf("body size %d %v", n, err)
	}
}

func TestAnIngressThatCannotBeServedIsRefusedNamingTheField(t *testing.T) {
	for _, c := range []struct{ from, to, says string }{
		{"host: shop.example.com", "host: 10.0.0.1", "spec.rules[0].host"},
		{"host: \"*.example.com\"", "host: \"a.*.example.com\"", "spec.rules[1].host"},
		{"{path: /, pathType: Prefix,", "{path: relative, pathType: Prefix,", "spec.rules[0].http.paths[0].path"},
		{"pathType: Exact", "pathType: Regex", "spec.rules[1].http.paths[0].pathType"},
		{"port: {number: 8080}", "port: {number: 0}", "spec.rules[1].http.paths[0].backend.service.port.number"},
		{"port: {name: http}", "port: {name: http, number: 80}", "spec.rules[0].http.paths[0].backend.service.port"},
		{"secretName: shop-tls", "secretName: \"\"", "spec.tls[0].secretName"},
		{"proxy-body-size: 8m", "proxy-body-size: lots", "proxy-body-size"},
		{"defaultBackend: {service: {name: web, port: {number: 80}}}", "defaultBackend: {resource: {kind: Bucket, name: b}}", "spec.defaultBackend.resource"},
		{"{path: /, pathType: Prefix,", "{path: /a/../b, pathType: Prefix,", "must not contain '/../'"},
		{"{path: /api, pathType: Exact,", "{path: /api/., pathType: Exact,", "must not end with '/.'"},
		{"proxy-body-size: 8m", "proxy-body-size: 8m, nginx.ingress.kubernetes.io/rewrite-target: /$2", "path rewriting is not supported"},
		{"{path: /, pathType: Prefix,", "{path: \"/api(/|$)(.*)\", pathType: Prefix,", "looks like a regular expression"},
	} {
		doc := strings.Replace(goodIngress, c.from, c.to, 1)
		if doc == goodIngress {
			t.Fatalf("%q is not in the manifest", c.from)
		}
		_, err := Parse([]byte(doc), "test.yaml")
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error naming %s", c.to, err, c.says)
		}
	}
}

func TestBodySizesReadAsIngressNginxReadsThem(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1m": 1 << 20, "512k": 512 << 10, "2G": 2 << 30, "100": 100, "10Mi": 10 << 20} {
		if got, err := BodyBytes(in); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1x", "2T"} {
		if _, err := BodyBytes(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestAResourceBackendIsRefusedOnce(t *testing.T) {
	doc := strings.Replace(goodIngress, "defaultBackend: {service: {name: web, port: {number: 80}}}", "defaultBackend: {resource: {kind: Bucket, name: b}}", 1)
	_, err := Parse([]byte(doc), "test.yaml")
	if err == nil || strings.Count(err.Error(), "spec.defaultBackend.resource") != 1 {
		t.Errorf("a resource backend: %v, want one error naming it", err)
	}
}

// TestObjectsAppliedAreHeldToNewRules: an ACME Ingress whose TLS entry
// has no hosts takes its rules' hosts, and a wildcard among them is
// refused at apply, naming the rule and the fix (HTTP-01 cannot prove
// it, and the whole order would fail); a StatefulSet's name must be one
// label. Stored objects are not held to these: they still decode.
func TestObjectsAppliedAreHeldToNewRules(t *testing.T) {
	doc := strings.Replace(goodIngress, "tls: [{hosts: [shop.example.com], secretName: shop-tls}]", "tls: [{secretName: shop-tls}]", 1)
	doc = strings.Replace(doc, "annotations: {", "annotations: {kubernetes.io/tls-acme: \"true\", ", 1)
	doc += `---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db.v2}
spec:
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: db, image: busybox}]
`
	objs, err := Parse([]byte(doc), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	err = AdmitNew(objs)
	for _, want := range []string{"Ingress default/shop", "spec.rules[1].host", "spec.tls[0].hosts", "StatefulSet default/db.v2", "metadata.name"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("AdmitNew: %v, want an error naming %s", err, want)
		}
	}
	for _, o := range objs {
		b, err := Encode(o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(b); err != nil {
			t.Errorf("a stored %s no longer decodes: %v", o.Kind, err)
		}
	}
	fixed := strings.Replace(goodIngress, "annotations: {", "annotations: {kubernetes.io/tls-acme: \"true\", ", 1)
	if objs, err := Parse([]byte(fixed), "test.yaml"); err != nil || AdmitNew(objs) != nil {
		t.Errorf("with its TLS hosts listed: %v %v", err, AdmitNew(objs))
	}
}
