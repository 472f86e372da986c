package rollout

import "github.com/starling-orchestrator/starling/node/api"

// Count measures how far Deployment namespace/name has come towards spec
// hash hash with replicas replicas, from reps: the replica copies that
// live nodes report in their status records (other Deployments' copies
// may be among them and are skipped). See api.RolloutCounts for what each
// count means. A copy is ready only when its phase is Running and Ready is
// set, so a Terminating copy is never ready.
func Count(namespace, name, hash string, replicas int, reps []api.Replica) api.RolloutCounts {
	replicas = max(replicas, 0)
	c := api.RolloutCounts{Replicas: replicas}
	updated := make([]bool, replicas)
	ready := make([]bool, replicas)
	available := make([]bool, replicas)
	for _, r := range reps {
		if r.Namespace != namespace || r.Workload != name {
			continue
		}
		if r.Ordinal < 0 || r.Ordinal >= replicas || r.SpecHash != hash {
			c.Old++
			if r.Ordinal >= 0 && r.Ordinal < replicas && Ready(r) {
				available[r.Ordinal] = true
			}
			continue
		}
		if r.Phase != api.PhaseTerminating {
			updated[r.Ordinal] = true
		}
		if Ready(r) {
			ready[r.Ordinal], available[r.Ordinal] = true, true
		}
	}
	for i := 0; i < replicas; i++ {
		c.Updated += b2i(updated[i])
		c.Ready += b2i(ready[i])
		c.Available += b2i(available[i])
	}
	return c
}

// Ready reports whether a copy serves: Running and ready.
func Ready(r api.Replica) bool { return r.Phase == api.PhaseRunning && r.Ready }

// Complete reports whether a rollout is done: every ordinal has a ready
// copy of the current hash and no other copy is left.
func Complete(c api.RolloutCounts) bool {
	return c.Updated == c.Replicas && c.Ready == c.Replicas && c.Old == 0
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
