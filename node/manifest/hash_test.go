package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// parseDeployment parses one Deployment manifest without defaulting, to
// show that SpecHash defaults by itself.
func parseDeployment(t *testing.T, manifest string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte(manifest), &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

func TestSpecHashFormatAndStability(t *testing.T) {
	d := parseDeployment(t, goodDeployment)
	h := SpecHash(d)
	if !regexp.MustCompile(`^[0-9a-f]{8}$`).MatchString(h) {
		t.Fatalf("SpecHash = %q, want 8 lowercase hex characters", h)
	}
	// Pinned: replica names embed this hash, so changing what it covers
	// restarts every replica in every cluster on upgrade. Change it only on
	// purpose.
	// (fc57c477 until probes were covered: changing a probe must roll the
	// replicas, as in Kubernetes.)
	if want := "9b020f85"; h != want {
		t.Errorf("SpecHash(goodDeployment) = %q, want %q", h, want)
	}
	if again := SpecHash(parseDeployment(t, goodDeployment)); again != h {
		t.Errorf("SpecHash not deterministic: %q then %q", h, again)
	}
	// A probe is part of the spec: changing it rolls the replicas.
	probed := parseDeployment(t, goodDeployment)
	probed.Spec.Template.Spec.Containers[0].ReadinessProbe.PeriodSeconds = 3
	if SpecHash(probed) == h {
		t.Error("changing readinessProbe.periodSeconds left SpecHash unchanged")
	}
	objs, err := Parse([]byte(goodDeployment), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := SpecHash(objs[0].Deployment); got != h {
		t.Errorf("defaulted Deployment hashes to %q, undefaulted to %q", got, h)
	}
	if SpecHash(nil) == "" {
		t.Error("SpecHash(nil) is empty")
	}
}

func TestSpecHashCoversExactlyTheReplicaFields(t *testing.T) {
	base := SpecHash(parseDeployment(t, goodDeployment))
	tests := []struct {
		name     string
		old, new string
		changes  bool
	}{
		{"replicas", "spec:\n  selector", "spec:\n  replicas: 7\n  selector", false},
		{"strategy", "spec:\n  selector", "spec:\n  strategy:\n    type: Recreate\n  selector", false},
		{"deployment labels", "  labels:\n    app: hello\n", "  labels:\n    app: hello\n    team: web\n", false},
		{"deployment annotations", "metadata:\n  name: hello", "metadata:\n  annotations: {note: x}\n  name: hello", false},
		{"equal quantity written differently", "cpu: 500m", "cpu: \"0.5\"", false},
		{"explicit default protocol", "containerPort: 80", "containerPort: 80\n          protocol: TCP", false},
		{"image", "nginx:1.27", "nginx:1.28", true},
		{"env value", "value: hi", "value: hello", true},
		{"args", `"daemon off;"`, `"daemon on;"`, true},
		{"command", "        args:", "        command: [nginx]\n        args:", true},
		{"ports", "containerPort: 80", "containerPort: 8080", true},
		{"resources", "memory: 128Mi", "memory: 256Mi", true},
		{"workingDir", "        args:", "        workingDir: /srv\n        args:", true},
		{"restartedAt annotation", "      labels:\n        app: hello\n    spec:", "      labels:\n        app: hello\n      annotations:\n        kubectl.kubernetes.io/restartedAt: \"2026-01-02T03:04:05Z\"\n    spec:", true},
		{"other template annotation", "      labels:\n        app: hello\n    spec:", "      labels:\n        app: hello\n      annotations:\n        note: x\n    spec:", false},
		{"template labels", "      labels:\n        app: hello\n    spec:", "      labels:\n        app: hello\n        tier: web\n    spec:", false},
		{"terminationGracePeriodSeconds 30 (the default)", "    spec:\n      containers:", "    spec:\n      terminationGracePeriodSeconds: 30\n      containers:", false},
		{"terminationGracePeriodSeconds", "    spec:\n      containers:", "    spec:\n      terminationGracePeriodSeconds: 5\n      containers:", true},
		{"nodeSelector", "    spec:\n      containers:", "    spec:\n      nodeSelector: {disk: ssd}\n      containers:", true},
		{"enableServiceLinks default", "    spec:\n      containers:", "    spec:\n      enableServiceLinks: true\n      containers:", false},
		{"preStop hook", "        args:", "        lifecycle: {preStop: {sleep: {seconds: 5}}}\n        args:", true},
		{"enableServiceLinks false", "    spec:\n      containers:", "    spec:\n      enableServiceLinks: false\n      containers:", true},
		{"dnsPolicy ClusterFirst (the default)", "    spec:\n      containers:", "    spec:\n      dnsPolicy: ClusterFirst\n      containers:", false},
		{"dnsPolicy", "    spec:\n      containers:", "    spec:\n      dnsPolicy: Default\n      containers:", true},
		{"hostname", "    spec:\n      containers:", "    spec:\n      hostname: web\n      containers:", true},
		{"hostAliases", "    spec:\n      containers:", "    spec:\n      hostAliases: [{ip: 10.0.0.1, hostnames: [db]}]\n      containers:", true},
		{"dnsConfig", "    spec:\n      containers:", "    spec:\n      dnsConfig: {searches: [lan]}\n      containers:", true},
		{"empty securityContexts (as kubectl prints them)", "        image: nginx:1.27", "        image: nginx:1.27\n        securityContext: {privileged: false}", false},
		{"empty pod securityContext", "    spec:\n      containers:", "    spec:\n      securityContext: {}\n      containers:", false},
		{"container securityContext", "        image: nginx:1.27", "        image: nginx:1.27\n        securityContext: {runAsUser: 1000}", true},
		{"pod securityContext", "    spec:\n      containers:", "    spec:\n      securityContext: {runAsNonRoot: true}\n      containers:", true},
		// A volume, a mount or a pull secret added used to keep the hash:
		// replicas of one name then ran different specs, and nothing rolled.
		{"a volume and its mount", "    spec:\n      containers:\n      - name: web\n", "    spec:\n      volumes: [{name: data, emptyDir: {}}]\n      containers:\n      - name: web\n        volumeMounts: [{name: data, mountPath: /data}]\n", true},
		{"imagePullSecrets", "    spec:\n      containers:", "    spec:\n      imagePullSecrets: [{name: reg}]\n      containers:", true},
		{"an init container", "    spec:\n      containers:", "    spec:\n      initContainers: [{name: init, image: busybox}]\n      containers:", true},
		{"a second container", "    spec:\n      containers:", "    spec:\n      containers:\n      - {name: log, image: busybox}", true},
		{"shareProcessNamespace", "    spec:\n      containers:", "    spec:\n      shareProcessNamespace: true\n      containers:", true},
		{"shareProcessNamespace false (the default)", "    spec:\n      containers:", "    spec:\n      shareProcessNamespace: false\n      containers:", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SpecHash(parseDeployment(t, edit(t, goodDeployment, tt.old, tt.new)))
			if changed := got != base; changed != tt.changes {
				t.Errorf("hash %s -> %s: changed = %v, want %v", base, got, changed, tt.changes)
			}
		})
	}
}

// legacySpecHash is SpecHash as first released (before workingDir and the
// restartedAt annotation were covered), kept to prove that appending
// omitempty fields left every existing hash, and so every running
// replica's name, unchanged.
func legacySpecHash(d *appsv1.Deployment) string {
	type legacySpec struct {
		Image     string                      `json:"image"`
		Command   []string                    `json:"command,omitempty"`
		Args      []string                    `json:"args,omitempty"`
		Env       []corev1.EnvVar             `json:"env,omitempty"`
		Ports     []corev1.ContainerPort      `json:"ports,omitempty"`
		Resources corev1.ResourceRequirements `json:"resources"`
	}
	var specs []legacySpec
	for _, c := range d.Spec.Template.Spec.Containers {
		c = *c.DeepCopy()
		defaultContainer(&c)
		specs = append(specs, legacySpec{c.Image, c.Command, c.Args, c.Env, c.Ports, c.Resources})
	}
	js, _ := json.Marshal(specs)
	sum := sha256.Sum256(js)
	return hex.EncodeToString(sum[:4])
}

func TestSpecHashLeavesOutTheDefaultFileModeOfVolumes(t *testing.T) {
	with := func(mode string) string {
		return SpecHash(parseDeployment(t, edit(t, goodDeployment, "    spec:\n      containers:", "    spec:\n      volumes: [{name: conf, configMap: {name: conf"+mode+"}}]\n      containers:")))
	}
	if with("") != with(", defaultMode: 420") {
		t.Error("defaultMode 420 (0644, the default) changed the hash")
	}
	if with("") == with(", defaultMode: 256") {
		t.Error("defaultMode 256 (0400) left the hash unchanged")
	}
	// What kubectl get -o yaml adds: hostPath's type "", a field's v1.
	vol := func(v string) string {
		return SpecHash(parseDeployment(t, edit(t, goodDeployment, "    spec:\n      containers:", "    spec:\n      volumes: ["+v+"]\n      containers:")))
	}
	for _, pair := range [][2]string{
		{"{name: h, hostPath: {path: /srv}}", `{name: h, hostPath: {path: /srv, type: ""}}`},
		{"{name: i, downwardAPI: {items: [{path: podname, fieldRef: {fieldPath: metadata.name}}]}}", "{name: i, downwardAPI: {items: [{path: podname, fieldRef: {apiVersion: v1, fieldPath: metadata.name}}]}}"},
	} {
		if vol(pair[0]) != vol(pair[1]) {
			t.Errorf("%s and %s hash apart", pair[0], pair[1])
		}
	}
	sidecar := func(policy string) string {
		return SpecHash(parseDeployment(t, edit(t, goodDeployment, "    spec:\n      containers:", "    spec:\n      initContainers: [{name: proxy, image: busybox"+policy+"}]\n      containers:")))
	}
	if sidecar("") == sidecar(", restartPolicy: Always") {
		t.Error("an init container turned sidecar kept the hash")
	}
}

func TestSpecHashUnchangedForTemplatesWithoutWorkingDirOrRestart(t *testing.T) {
	manifests := map[string]string{
		"good":             goodDeployment,
		"no resources":     edit(t, goodDeployment, "        resources:\n          limits:\n            cpu: 500m\n            memory: 128Mi\n", ""),
		"command":          edit(t, goodDeployment, "        args:", "        command: [nginx]\n        args:"),
		"other annotation": edit(t, goodDeployment, "      labels:\n        app: hello\n    spec:", "      labels:\n        app: hello\n      annotations: {note: x}\n    spec:"),
	}
	for name, m := range manifests {
		d := parseDeployment(t, m)
		// Probes are covered on purpose since; without them the hash is
		// the released one.
		for i := range d.Spec.Template.Spec.Containers {
			c := &d.Spec.Template.Spec.Containers[i]
			c.ReadinessProbe, c.LivenessProbe, c.StartupProbe = nil, nil, nil
		}
		if got, want := SpecHash(d), legacySpecHash(d); got != want {
			t.Errorf("%s: SpecHash = %s, the released hash was %s", name, got, want)
		}
	}
	// And a template that uses the new fields hashes differently.
	d := parseDeployment(t, edit(t, goodDeployment, "        args:", "        workingDir: /srv\n        args:"))
	if SpecHash(d) == legacySpecHash(d) {
		t.Error("workingDir does not change the hash")
	}
}
