package view

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// TestPodRequestsAreTheKubeletsEffectiveRequest: the app containers and
// sidecars add up; an init container counts with the sidecars before
// it, and only where it is the larger.
func TestPodRequestsAreTheKubeletsEffectiveRequest(t *testing.T) {
	s := reconcile.Spec{CPURequestMillis: 100, MemoryRequestBytes: 100,
		Containers: []reconcile.Spec{{CPURequestMillis: 50, MemoryRequestBytes: 50}},
		Init: []reconcile.Spec{
			{CPURequestMillis: 20, MemoryRequestBytes: 20, Sidecar: true},
			{CPURequestMillis: 500, MemoryRequestBytes: 10},
		},
	}
	cpu, mem := podRequests(s)
	if cpu != 520 || mem != 170 {
		t.Errorf("podRequests = %d m, %d B; want 520 m (sidecar 20 + init 500), 170 B (100 + 50 + 20)", cpu, mem)
	}
	// An init container before the sidecar does not count it.
	s.Init[0], s.Init[1] = s.Init[1], s.Init[0]
	if cpu, _ := podRequests(s); cpu != 500 {
		t.Errorf("init 500 m, then a sidecar of 20 m, app 150 m: %d m, want 500 m (the kubelet's)", cpu)
	}
}

// TestANamedTargetPortFindsASidecarsPort: a Service's named targetPort
// resolves against the app containers and the native sidecars, not the
// init containers that run to completion.
func TestANamedTargetPortFindsASidecarsPort(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	d := manifest.Object{Deployment: &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "web", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}},
		InitContainers: []corev1.Container{
			{Name: "setup", Ports: []corev1.ContainerPort{{Name: "setup", ContainerPort: 7000, Protocol: corev1.ProtocolTCP}}},
			{Name: "proxy", RestartPolicy: &always, Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}}},
		},
	}}}}}
	for name, want := range map[string]int32{"http": 8080, "proxy": 9090, "setup": 0} {
		got, ok := TargetPort(corev1.ServicePort{Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString(name)}, d)
		if got != want || ok != (want != 0) {
			t.Errorf("targetPort %q = %d, %v; want %d", name, got, ok, want)
		}
	}
}

// TestResourcesOfAnotherContainerReachEnvAndFiles: an env var and a
// downwardAPI file name another container's resources; a limit the
// container sets is its value, one it does not is left to the node.
func TestResourcesOfAnotherContainerReachEnvAndFiles(t *testing.T) {
	objs, err := manifest.Parse([]byte(`apiVersion: apps/v1
kind: Deployment
metadata: {name: app}
spec:
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      containers:
      - name: web
        image: web
        env: [{name: LOG_CPU, valueFrom: {resourceFieldRef: {containerName: log, resource: requests.cpu, divisor: 1m}}}]
      - name: log
        image: log
        resources: {requests: {cpu: 250m}, limits: {memory: 64Mi}}
      volumes:
      - name: info
        downwardAPI:
          items:
          - {path: log-mem, resourceFieldRef: {containerName: log, resource: limits.memory, divisor: 1Mi}}
          - {path: web-mem, resourceFieldRef: {containerName: web, resource: limits.memory}}
`), "app.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := specOf(objs[0])
	if e := s.Env[0]; e.Value != "250" || !e.Literal {
		t.Errorf("LOG_CPU = %+v, want 250 (log's request in millicores)", e)
	}
	fields := s.Volumes[0].Sources[0].Fields
	if len(fields) != 2 || fields[0].Value != "64" || fields[1].Resource != "limits.memory" || fields[1].Value != "" {
		t.Errorf("files = %+v, want log-mem 64 and web-mem left to the node's allocatable", fields)
	}
}
