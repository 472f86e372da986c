package e2e

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
)

// TestSecretValuesNeverShowInClear: a Secret created on one node is read
// on the other (gossiped, opened there), and its value never lies in
// clear in either node's data directory, in get -o yaml or describe, in
// the agents' logs or in /metrics; only get secret NAME --reveal shows
// it. A ConfigMap's value, written the same way, is found in the data
// directory: the search of the files would see a value in clear.
func TestSecretValuesNeverShowInClear(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	n1, n2 := c.Nodes[0], c.Nodes[1]
	const ns, value, plainValue = "cfgsecret", "KnownValue-7f3a9c41", "PlainConfigValue-2d8e"
	b64 := base64.StdEncoding.EncodeToString([]byte(value))
	out, err := n1.CLI("create", "secret", "generic", "db", "-n", ns, "--from-literal", "password="+value, "--from-literal", "user=admin")
	if err != nil || !strings.Contains(out, "secret/db created") {
		t.Fatalf("create secret: %q %v", out, err)
	}
	if _, err := n1.CLI("create", "secret", "generic", "db", "-n", ns, "--from-literal", "password=x"); err == nil || !strings.Contains(err.Error(), `secret "db" already exists`) {
		t.Fatalf("create of an existing Secret: %v", err)
	}
	// Applied twice, a sealed Secret is unchanged the second time.
	tlsSecret := "apiVersion: v1\nkind: Secret\nmetadata: {name: site, namespace: " + ns + "}\ntype: kubernetes.io/tls\nstringData: {tls.crt: cert, tls.key: key}\n"
	for _, want := range []string{"secret/site created", "secret/site unchanged"} {
		if out, err := n1.CLIInput(strings.NewReader(tlsSecret), "apply", "-f", "-"); err != nil || !strings.Contains(out, want) {
			t.Fatalf("apply of a Secret: %q %v, want %q", out, err, want)
		}
	}
	apply(t, n1, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: "+ns+"}\nimmutable: true\ndata: {mode: "+plainValue+"}\n")

	// The other node reads both, the Secret opened with its own key.
	took, err := eventually(30*time.Second, func() error {
		if _, err := n2.CLI("get", "configmap", "settings", "-n", ns); err != nil {
			return err
		}
		out, err := n2.CLI("get", "secret", "db", "-n", ns, "-o", "yaml", "--reveal")
		if err != nil {
			return err
		}
		if !strings.Contains(out, b64) {
			t.Fatalf("get --reveal on n2 does not hold the value:\n%s", out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the Secret read, opened, on the other node %v after create", took.Round(time.Millisecond))

	shown := map[string]string{}
	for _, n := range c.Nodes {
		for _, args := range [][]string{
			{"get", "secret", "db", "-n", ns, "-o", "yaml"},
			{"get", "secrets", "-n", ns, "-o", "json"},
			{"get", "secrets", "-A"},
			{"describe", "secret", "db", "-n", ns},
		} {
			out, err := n.CLI(args...)
			if err != nil {
				t.Fatal(err)
			}
			shown[n.Name+": "+strings.Join(args, " ")] = out
		}
	}
	if out := shown["n1: get secret db -n "+ns+" -o yaml"]; !strings.Contains(out, "password: 19 bytes") {
		t.Errorf("get -o yaml does not give the values' sizes:\n%s", out)
	}
	if out := shown["n2: describe secret db -n "+ns]; !strings.Contains(out, "password: 19 bytes") || !strings.Contains(out, "Opaque") {
		t.Errorf("describe does not give the type and sizes:\n%s", out)
	}
	for _, n := range c.Nodes {
		text, err := n.API().Metrics(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		shown[n.Name+": /metrics"] = text
		log, _ := os.ReadFile(n.AgentLogPath())
		shown[n.Name+": agent log"] = string(log)
	}
	if l := grepLines(shown["n2: agent log"], "values were revealed"); !strings.Contains(l, "secret="+ns+"/db") {
		t.Errorf("n2's log has no audit line of the reveal")
	}
	for where, out := range shown {
		if strings.Contains(out, value) || strings.Contains(out, b64) {
			t.Errorf("%s shows the Secret's value:\n%s", where, out)
		}
	}

	// Neither data directory holds the value; both hold the ConfigMap's.
	for _, n := range c.Nodes {
		var secret, plain []string
		filepath.WalkDir(n.DataDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return nil
			}
			if bytes.Contains(data, []byte(value)) || bytes.Contains(data, []byte(b64)) {
				secret = append(secret, path)
			}
			if bytes.Contains(data, []byte(plainValue)) {
				plain = append(plain, path)
			}
			return nil
		})
		if len(secret) > 0 {
			t.Errorf("%s: the Secret's value is in clear in %v", n.Name, secret)
		}
		if len(plain) == 0 {
			t.Errorf("%s: the ConfigMap's value is nowhere in %s: the search proves nothing", n.Name, n.DataDir)
		}
	}

	// An immutable ConfigMap refuses a change, naming the field, and
	// keeps what it held.
	_, err = n2.CLIInput(strings.NewReader("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: "+ns+"}\nimmutable: true\ndata: {mode: other}\n"), "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), "data: Forbidden: field is immutable when `immutable` is set") {
		t.Fatalf("change of an immutable ConfigMap: %v", err)
	}
	if out, _ := n1.CLI("get", "configmap", "settings", "-n", ns, "-o", "yaml"); !strings.Contains(out, plainValue) {
		t.Fatalf("the immutable ConfigMap changed:\n%s", out)
	}
	// Over the size limit: refused, naming the object and the limit.
	big := strings.Repeat("x", 1100<<10)
	_, err = n1.CLIInput(strings.NewReader("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: big, namespace: "+ns+"}\ndata: {blob: "+big+"}\n"), "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), "big") || !strings.Contains(err.Error(), "1048576") && !strings.Contains(err.Error(), "1.0 MiB") {
		t.Fatalf("a ConfigMap over the limit: %v", err)
	}
}

// TestReplicaWaitsForItsSecretAndStartsWhenItIsThere: a replica whose
// env names a missing Secret, then a missing key, shows
// CreateContainerConfigError with the kubelet's message, and starts by
// itself once the key is there, with the Secret's value, a ConfigMap's
// keys (envFrom, prefixed) and the node's address in its environment.
// A later change of the Secret restarts nothing, as in Kubernetes.
func TestReplicaWaitsForItsSecretAndStartsWhenItIsThere(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2)
	n1 := c.Nodes[0]
	importEcho(t, c.Nodes...)
	const ns = "cfgenv"
	app := echoApp("cfgenv-web", 1, "")
	app.Namespace = ns
	app.Env = []corev1.EnvVar{
		{Name: "GREETING", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfgenv-secret"}, Key: "greeting"}}},
		{Name: "HOST", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
		{Name: "MESSAGE", Value: "$(GREETING)/$(APP_MODE)/$(HOST)"},
	}
	apply(t, n1, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfgenv-settings, namespace: "+ns+"}\ndata: {MODE: fast}\n")
	apply(t, n1, app.Deployment(func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: "APP_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfgenv-settings"}}}}
	}))
	waitReason := func(want string) {
		t.Helper()
		if _, err := eventually(30*time.Second, func() error {
			all, err := replicas(n1)
			if err != nil {
				return err
			}
			for _, r := range all {
				if r.Namespace == ns && r.Phase == api.PhaseConfigError && r.Reason == want {
					return nil
				}
			}
			return fmt.Errorf("no replica of %s is %s with %q: %+v", ns, api.PhaseConfigError, want, all)
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitReason(`secret "cfgenv-secret" not found`)
	if _, err := n1.CLI("create", "secret", "generic", "cfgenv-secret", "-n", ns, "--from-literal", "other=x"); err != nil {
		t.Fatal(err)
	}
	waitReason("couldn't find key greeting in Secret cfgenv/cfgenv-secret")
	set := time.Now()
	apply(t, n1, "apiVersion: v1\nkind: Secret\nmetadata: {name: cfgenv-secret, namespace: "+ns+"}\nstringData: {greeting: hello-from-secret}\n")
	var web replica
	took, err := eventually(30*time.Second, func() error {
		all, err := replicas(n1)
		if err != nil {
			return err
		}
		for _, r := range all {
			if r.Namespace == ns && r.Phase == api.PhaseRunning && r.PodIP != "" {
				web = r
				return nil
			}
		}
		return fmt.Errorf("not running: %+v", all)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("running %v after the key was written (%v since)", took.Round(time.Millisecond), time.Since(set).Round(time.Millisecond))
	owner := c.Nodes[0]
	if web.Node == "n2" {
		owner = c.Nodes[1]
	}
	body, err := owner.ReplicaHTTPGet(ns, web.Name, "http://"+web.PodIP+":8080/", 5*time.Second)
	if want := "message=hello-from-secret/fast/" + owner.IP + "\n"; err != nil || !strings.Contains(body, want) {
		t.Fatalf("the replica's environment: %q %v, want %q", body, err, want)
	}
	for _, n := range c.Nodes {
		if log, _ := os.ReadFile(n.AgentLogPath()); strings.Contains(string(log), "hello-from-secret") {
			t.Fatalf("%s's agent log shows the Secret's value", n.Name)
		}
	}
	// A changed value restarts nothing (Kubernetes does not either):
	// 'rollout restart' takes it.
	apply(t, n1, "apiVersion: v1\nkind: Secret\nmetadata: {name: cfgenv-secret, namespace: "+ns+"}\nstringData: {greeting: changed}\n")
	time.Sleep(5 * time.Second)
	all, err := replicas(n1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.Namespace == ns && (r.Name != web.Name || r.Restarts != 0) {
			t.Fatalf("a Secret's change restarted or replaced the replica: %+v, was %+v", r, web)
		}
	}
}
