package view

import (
	"testing"

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
