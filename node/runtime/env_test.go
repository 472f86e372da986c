package runtime

import (
	"slices"
	"testing"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

// TestExpand: the kubelet's $(VAR) rules (third_party/forked/golang/expansion
// test cases).
func TestExpand(t *testing.T) {
	vars := map[string]string{"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": ""}
	for in, want := range map[string]string{
		"$(VAR_A)":                 "A",
		"___$(VAR_B)___":           "___B___",
		"$(VAR_A)-$(VAR_A)":        "A-A",
		"$(VAR_A)$(VAR_B)$(VAR_C)": "ABC",
		"$(VAR_REF)":               "$(VAR_A)", // no recursion
		"$(VAR_EMPTY)":             "",
		"$(UNKNOWN)":               "$(UNKNOWN)",
		"$$(VAR_A)":                "$(VAR_A)",
		"$$$(VAR_A)":               "$A",
		"$$$$(VAR_A)":              "$$(VAR_A)",
		"$(VAR_A":                  "$(VAR_A",
		"$VAR_A":                   "$VAR_A",
		"$":                        "$",
		"foo$":                     "foo$",
		"$()":                      "$()",
		"echo $(date) $$HOME":      "echo $(date) $HOME",
		"f$(VAR_A)$":               "fA$",
		"no reference":             "no reference",
		"$(VAR_A)$(VAR_B":          "A$(VAR_B",
		"${VAR_A}":                 "${VAR_A}",
	} {
		if got := expand(in, vars); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestContainerEnv: values refer to variables defined before them, not
// after; downward API fields are filled in; a later duplicate replaces an
// earlier one in place; command and args see the whole env.
func TestContainerEnv(t *testing.T) {
	env, vars := containerEnv([]reconcile.EnvVar{
		{Name: "POD_IP", FieldPath: "status.podIP"},
		{Name: "URL", Value: "http://$(POD_IP):$(PORT)/"},
		{Name: "PORT", Value: "8080"},
		{Name: "ME", FieldPath: "metadata.name"},
		{Name: "NS", FieldPath: "metadata.namespace"},
		{Name: "NODE", FieldPath: "spec.nodeName"},
		{Name: "PORT", Value: "9090"},
		{Name: "LITERAL", Value: "$$(PORT)"},
		{Name: "FROM_SECRET", Value: "a$(PORT)$$b", Literal: true},
		{Name: "UID", FieldPath: "metadata.uid"},
		{Name: "HOST", FieldPath: "status.hostIP"},
	}, nil, podFields{Name: "web-0", Namespace: "shop", UID: "u-1", NodeName: "n2", PodIP: "10.22.1.5", HostIP: "192.0.2.2"})
	want := []string{"POD_IP=10.22.1.5", "URL=http://10.22.1.5:$(PORT)/", "PORT=9090", "ME=web-0", "NS=shop", "NODE=n2", "LITERAL=$(PORT)",
		"FROM_SECRET=a$(PORT)$$b", "UID=u-1", "HOST=192.0.2.2"}
	if !slices.Equal(env, want) {
		t.Fatalf("env:\n got %q\nwant %q", env, want)
	}
	if got := expandAll([]string{"sh", "-c", "serve --port $(PORT) --name $(ME) $(HOME)"}, vars); got[2] != "serve --port 9090 --name web-0 $(HOME)" {
		t.Fatalf("args: %q", got)
	}
}

// Service variables as the kubelet adds them: env values and command
// refer to them, a variable of the template wins over a Service's, and
// the others come after the template's.
func TestContainerEnvWithServiceLinks(t *testing.T) {
	svc := []reconcile.EnvVar{
		{Name: "REDIS_SERVICE_HOST", Value: "10.96.0.7"},
		{Name: "REDIS_SERVICE_PORT", Value: "6379"},
		{Name: "WEB_SERVICE_HOST", Value: "10.96.0.9"},
	}
	env, vars := containerEnv([]reconcile.EnvVar{
		{Name: "REDIS_URL", Value: "redis://$(REDIS_SERVICE_HOST):$(REDIS_SERVICE_PORT)"},
		{Name: "WEB_SERVICE_HOST", Value: "web.local"},
	}, svc, podFields{})
	want := []string{"REDIS_URL=redis://10.96.0.7:6379", "WEB_SERVICE_HOST=web.local", "REDIS_SERVICE_HOST=10.96.0.7", "REDIS_SERVICE_PORT=6379"}
	if !slices.Equal(env, want) {
		t.Fatalf("env:\n got %q\nwant %q", env, want)
	}
	if got := expandAll([]string{"$(REDIS_SERVICE_PORT) $(WEB_SERVICE_HOST)"}, vars); got[0] != "6379 web.local" {
		t.Fatalf("command expanded to %q", got[0])
	}
}
