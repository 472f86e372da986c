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
		got, ok := targetPort(corev1.ServicePort{Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString(name)}, d)
		if got != want || ok != (want != 0) {
			t.Errorf("targetPort %q = %d, %v; want %d", name, got, ok, want)
		}
	}
}
