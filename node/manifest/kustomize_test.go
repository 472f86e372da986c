package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKustomizationWithAGeneratedSecret: the WordPress-and-MySQL shape of
// the kubernetes.io tutorial: a secretGenerator's Secret gets a hash
// suffix, and the Deployment's secretKeyRef is rewritten to it.
func TestKustomizationWithAGeneratedSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("kustomization.yaml", "secretGenerator:\n- name: mysql-pass\n  literals:\n  - password=YOUR_PASSWORD\nresources:\n- db.yaml\n")
	write("db.yaml", strings.Replace(goodDeployment, "          value: hi", "          valueFrom:\n            secretKeyRef: {name: mysql-pass, key: password}", 1))
	objs, err := ReadKustomization(dir)
	if err != nil {
		t.Fatal(err)
	}
	var secret, ref string
	for _, o := range objs {
		if o.Secret != nil {
			secret = o.Name
			if string(o.Secret.Data["password"]) != "YOUR_PASSWORD" {
				t.Fatalf("secret data %q", o.Secret.Data)
			}
		}
		if o.Deployment != nil {
			ref = o.Deployment.Spec.Template.Spec.Containers[0].Env[0].ValueFrom.SecretKeyRef.Name
		}
	}
	if !strings.HasPrefix(secret, "mysql-pass-") || ref != secret {
		t.Fatalf("generated Secret %q, referred to as %q", secret, ref)
	}
	if _, err := ReadKustomization(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("a missing kustomization: %v", err)
	}
}
