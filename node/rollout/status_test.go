package rollout

import (
	"testing"

	"github.com/starling-orchestrator/starling/node/api"
)

// copyOf is a copy of web's ordinal with hash, phase and readiness.
func copyOf(ordinal int, hash string, phase api.Phase, ready bool) api.Replica {
	return api.Replica{Namespace: "default", Workload: "web", Ordinal: ordinal, SpecHash: hash, Phase: phase, Ready: ready}
}

func TestCountMeasuresRolloutProgress(t *testing.T) {
	const cur, old = "cccccccc", "oooooooo"
	tests := []struct {
		name     string
		replicas int
		reps     []api.Replica
		want     api.RolloutCounts
		complete bool
	}{
		{"nothing reported yet", 3, nil, api.RolloutCounts{Replicas: 3}, false},
		{"all current and ready", 2, []api.Replica{
			copyOf(0, cur, "Running", true), copyOf(1, cur, "Running", true),
		}, api.RolloutCounts{Replicas: 2, Updated: 2, Ready: 2, Available: 2}, true},
		{"spec just changed: all old", 2, []api.Replica{
			copyOf(0, old, "Running", true), copyOf(1, old, "Running", true),
		}, api.RolloutCounts{Replicas: 2, Available: 2, Old: 2}, false},
		{"halfway, with a surge copy next to its old one", 3, []api.Replica{
			copyOf(0, cur, "Running", true),
			copyOf(1, cur, "ContainerCreating", false), copyOf(1, old, "Running", true),
			copyOf(2, old, "Running", true),
		}, api.RolloutCounts{Replicas: 3, Updated: 2, Ready: 1, Available: 3, Old: 2}, false},
		{"pending and crashing current copies are updated, not ready", 2, []api.Replica{
			copyOf(0, cur, "Pending", false), copyOf(1, cur, "CrashLoopBackOff", false),
		}, api.RolloutCounts{Replicas: 2, Updated: 2}, false},
		{"running but not ready yet", 1, []api.Replica{copyOf(0, cur, "Running", false)},
			api.RolloutCounts{Replicas: 1, Updated: 1}, false},
		{"old copy terminating still counts as old", 1, []api.Replica{
			copyOf(0, cur, "Running", true), copyOf(0, old, "Terminating", false),
		}, api.RolloutCounts{Replicas: 1, Updated: 1, Ready: 1, Available: 1, Old: 1}, false},
		{"terminating current copy (handoff) is not updated", 1, []api.Replica{
			copyOf(0, cur, "Terminating", true),
		}, api.RolloutCounts{Replicas: 1}, false},
		{"two current copies of one ordinal count once", 1, []api.Replica{
			copyOf(0, cur, "Running", true), copyOf(0, cur, "Running", true),
		}, api.RolloutCounts{Replicas: 1, Updated: 1, Ready: 1, Available: 1}, true},
		{"scaled down: ordinals beyond replicas are old", 1, []api.Replica{
			copyOf(0, cur, "Running", true), copyOf(1, cur, "Running", true),
		}, api.RolloutCounts{Replicas: 1, Updated: 1, Ready: 1, Available: 1, Old: 1}, false},
		{"scaled to zero and gone", 0, nil, api.RolloutCounts{}, true},
		{"other deployments are not counted", 1, []api.Replica{
			copyOf(0, cur, "Running", true),
			{Namespace: "default", Workload: "web2", SpecHash: old, Phase: api.PhaseRunning, Ready: true},
			{Namespace: "other", Workload: "web", SpecHash: old, Phase: api.PhaseRunning, Ready: true},
		}, api.RolloutCounts{Replicas: 1, Updated: 1, Ready: 1, Available: 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Count("default", "web", cur, tt.replicas, tt.reps)
			if got != tt.want {
				t.Errorf("Count = %+v, want %+v", got, tt.want)
			}
			if Complete(got) != tt.complete {
				t.Errorf("Complete = %v, want %v", Complete(got), tt.complete)
			}
		})
	}
}
