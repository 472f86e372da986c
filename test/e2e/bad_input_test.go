package e2e

import (
	"strings"
	"testing"
)

const goodDeployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: keep}
spec:
  replicas: 0
  selector: {matchLabels: {app: keep}}
  template:
    metadata: {labels: {app: keep}}
    spec:
      containers: [{name: c, image: starling.local/echo:v1}]
`

// TestBadInputRejected checks that each kind of bad manifest makes the CLI
// exit non-zero with the offending field path in its message, and that
// nothing stored changes.
func TestBadInputRejected(t *testing.T) {
	c := newCluster(t, 1)
	n := c.Nodes[0]
	if _, err := n.CLIInput(strings.NewReader(goodDeployment), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	stored, err := n.CLI("get", "deployments", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	withSpec := func(replicas, port, image string) string {
		return `apiVersion: apps/v1
kind: Deployment
metadata: {name: keep}
spec:
  replicas: ` + replicas + `
  selector: {matchLabels: {app: keep}}
  template:
    metadata: {labels: {app: keep}}
    spec:
      containers: [{name: c, image: "` + image + `", ports: [{containerPort: ` + port + `}]}]
`
	}
	cases := []struct {
		name, manifest, want string
	}{
		{"negative replicas", withSpec("-1", "80", "x"), "spec.replicas: Invalid value: -1"},
		{"port out of range", withSpec("1", "70000", "x"), "spec.template.spec.containers[0].ports[0].containerPort: Invalid value: 70000"},
		{"missing image", withSpec("1", "80", ""), "spec.template.spec.containers[0].image: Required value"},
		{"unknown kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "Pod"},
		{"unsupported field", strings.Replace(goodDeployment, "containers:", "hostNetwork: true\n      containers:", 1), "spec.template.spec.hostNetwork"},
		{"malformed YAML", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: [\n", "<stdin>"},
		// A valid object next to a bad one: nothing of the batch is stored.
		{"bad object in a batch", strings.Replace(goodDeployment, "replicas: 0", "replicas: 2", 1) + "---\n" + withSpec("-1", "80", "x"), "spec.replicas: Invalid value: -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := n.CLIInput(strings.NewReader(tc.manifest), "apply", "-f", "-")
			if err == nil {
				t.Fatalf("apply succeeded: %s", out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not name %q:\n%v", tc.want, err)
			}
			now, err := n.CLI("get", "deployments", "-o", "json")
			if err != nil {
				t.Fatal(err)
			}
			if now != stored {
				t.Fatalf("stored state changed:\nbefore %s\nafter %s", stored, now)
			}
		})
	}
	// The server validates too: a scale to a bad value is refused.
	if _, err := n.CLI("scale", "deployment/keep", "--replicas", "-3"); err == nil || !strings.Contains(err.Error(), "spec.replicas") {
		t.Fatalf("scale to -3: %v", err)
	}
}
