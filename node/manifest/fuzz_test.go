package manifest

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// fuzzSeeds are good and bad manifests from the table tests, so the fuzzer
// starts from inputs that reach deep into decoding and validation.
func fuzzSeeds() []string {
	d := goodDeployment
	r := func(s, old, new string) string { return strings.Replace(s, old, new, 1) }
	return []string{
		"",
		"---\n",
		d,
		goodService,
		d + "---\n" + goodService,
		kubectlGetDeployment,
		kubectlGetService,
		`{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"ports":[{"port":53,"protocol":"UDP"}]}}`,
		`{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"type":"LoadBalancer","loadBalancerIP":"192.168.1.240","externalTrafficPolicy":"Local","ports":[{"port":80}]}}`,
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lb-pool, namespace: starling-system}\ndata: {cidr: 192.168.1.240/28}\n",
		"apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: s}, spec: {ports: [{port: 1}]}}\n",
		r(d, "spec:\n  selector", "spec:\n  replicas: -1\n  selector"),
		r(d, "containerPort: 80", "containerPort: 70000"),
		r(d, "        image: nginx:1.27\n", ""),
		"apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: db\n",
		r(d, "    spec:\n      containers:", "    spec:\n      volumes:\n      - name: data\n        emptyDir: {}\n      hostNetwork: true\n      containers:"),
		r(d, "    spec:\n      containers:", "    spec:\n      initContainers:\n      - name: init\n        image: busybox\n      containers:"),
		goodService + "---\napiVersion: v1\nkind: Service\nmetadata: {name: [\n",
		r(d, "        image: nginx:1.27", "        image: nginx:1.27\n        imagePolicy: Always"),
		r(d, "      labels:\n        app: hello", "      labels:\n        app: bye"),
		r(d, "spec:\n  selector", "spec:\n  strategy:\n    rollingUpdate: {maxSurge: 0, maxUnavailable: 101%}\n  selector"),
		r(d, "            memory: 128Mi", "            memory: 1e3000\n            nvidia.com/gpu: 1"),
		r(goodService, "spec:", "spec:\n  type: NodePort\n  clusterIP: None\n  externalTrafficPolicy: Local"),
		r(goodService, "  - port: 80", "  - port: 80\n    nodePort: 8080\n    targetPort: http-alt"),
		r(d, "          httpGet:\n            port: http\n", "          exec: {command: cat /tmp/ready}\n"),
		r(d, "          httpGet:\n            port: http\n", "          exec: {command: [sleep, 5, {a: 1}]}\n"),
		goodConfigMap,
		goodSecret,
		r(d, "    spec:\n      containers:", "    spec:\n      volumes:\n      - {name: cfg, configMap: {name: c, items: [{key: k, path: a/b, mode: 0400}]}}\n      - {name: p, projected: {sources: [{secret: {name: s}}, {downwardAPI: {items: [{path: l, fieldRef: {fieldPath: metadata.labels}}]}}]}}\n      containers:"),
		r(d, "          value: hi", "          valueFrom: {secretKeyRef: {name: s, key: k, optional: true}}"),
		"apiVersion: v1\nkind: Secret\nmetadata: {name: t}\ntype: kubernetes.io/tls\ndata: {tls.crt: eA==}\n",
		claimYAML,
		r(claimYAML, "ReadWriteOnce", "ReadOnlyMany"),
		goodIngress,
		r(goodIngress, "pathType: Exact", "pathType: Regex"),
		r(d, "    spec:\n      containers:", "    spec:\n      volumes:\n      - {name: data, persistentVolumeClaim: {claimName: data, readOnly: true}}\n      containers:"),
		"a: &a [*a, *a]\n",
		"- - - - - -\n",
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := Parse(data, "fuzz.yaml")
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v is %T, want *ValidationError", err, err)
			}
			if objs != nil {
				t.Fatalf("got %d objects and an error", len(objs))
			}
			if ve.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		for _, o := range objs {
			if errs := Validate(o); len(errs) > 0 {
				t.Fatalf("Parse returned %s, which does not validate: %v", o.Key(), errs)
			}
			checkRoundTrip(t, o)
		}
	})
}

func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds() {
		objs, err := Parse([]byte(s), "seed")
		if err != nil {
			// Bad manifests still make interesting (if unstored) input.
			f.Add([]byte(s))
			continue
		}
		for _, o := range objs {
			js, err := Encode(o)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(js)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := Decode(data)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v is %T, want *ValidationError", err, err)
			}
			return
		}
		checkRoundTrip(t, o)
	})
}

// checkRoundTrip asserts that a valid object survives storage: Encode, then
// Decode, then Encode again yields the same bytes.
func checkRoundTrip(t *testing.T, o Object) {
	t.Helper()
	js, err := Encode(o)
	if err != nil {
		t.Fatalf("Encode(%s): %v", o.Key(), err)
	}
	back, err := Decode(js)
	if err != nil {
		t.Fatalf("Decode(Encode(%s)): %v\n%s", o.Key(), err, js)
	}
	if back.Key() != o.Key() {
		t.Fatalf("key changed in round trip: %s -> %s", o.Key(), back.Key())
	}
	again, err := Encode(back)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(js, again) {
		t.Fatalf("round trip changed the encoding:\n%s\n%s", js, again)
	}
}
