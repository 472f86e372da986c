package rollout

import (
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/node/api"
)

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

// DeploymentStatus is d's status as Kubernetes defines it
// (apps/v1 DeploymentStatus), counted over every copy of its replicas that
// live nodes report in reps, whatever its spec hash (hash is d's current
// one):
//   - Replicas: copies that are not Terminating;
//   - UpdatedReplicas: those of the current hash;
//   - ReadyReplicas: copies Running and ready (old ones serve too);
//   - AvailableReplicas: as ReadyReplicas (minReadySeconds is not acted
//     on); UnavailableReplicas: desired minus available, at least 0;
//   - conditions Available (True when available >= desired -
//     maxUnavailable: MinimumReplicasAvailable, else
//     MinimumReplicasUnavailable) and Progressing (True with
//     NewReplicaSetAvailable once complete, True with ReplicaSetUpdated
//     while copies of the current hash appeared or became ready within
//     progressDeadlineSeconds (default 600) of now, False with
//     ProgressDeadlineExceeded after).
//
// kubectl's READY is ReadyReplicas/spec.replicas, UP-TO-DATE
// UpdatedReplicas, AVAILABLE AvailableReplicas.
func DeploymentStatus(d *appsv1.Deployment, hash string, reps []api.Replica, now time.Time) appsv1.DeploymentStatus {
	desired := 1
	if d.Spec.Replicas != nil {
		desired = max(int(*d.Spec.Replicas), 0)
	}
	st := appsv1.DeploymentStatus{ObservedGeneration: d.Generation}
	lastProgress := d.CreationTimestamp.Time
	// A copy of the current spec with no container yet, on an ordinal
	// that still runs a copy of another spec, waits for the rollout gate:
	// Kubernetes' controller would not have created its pod, so it counts
	// in neither replicas nor updatedReplicas.
	held := map[int]bool{}
	for _, r := range reps {
		if r.Namespace == d.Namespace && r.Workload == d.Name && r.SpecHash != hash && r.Phase != api.PhasePending && r.Phase != api.PhaseTerminating {
			held[r.Ordinal] = true
		}
	}
	for _, r := range reps {
		if r.Namespace != d.Namespace || r.Workload != d.Name || r.Phase == api.PhaseTerminating {
			continue
		}
		if r.SpecHash == hash && r.Phase == api.PhasePending && held[r.Ordinal] {
			continue
		}
		st.Replicas++
		if r.SpecHash == hash {
			st.UpdatedReplicas++
			if r.Created.After(lastProgress) {
				lastProgress = r.Created
			}
			if Ready(r) && r.Started.After(lastProgress) {
				lastProgress = r.Started
			}
		}
		if Ready(r) {
			st.ReadyReplicas++
		}
	}
	st.AvailableReplicas = st.ReadyReplicas
	// Kubernetes: the replicas of every ReplicaSet, surges included,
	// less the available ones.
	st.UnavailableReplicas = max(max(int32(desired), st.Replicas)-st.AvailableReplicas, 0)
	c := Count(d.Namespace, d.Name, hash, desired, reps)

	maxUnavailable := 0
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		maxUnavailable, _ = intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, desired, false)
	}
	available := corev1.ConditionTrue
	availableReason, availableMsg := "MinimumReplicasAvailable", "Deployment has minimum availability."
	if int(st.AvailableReplicas) < desired-maxUnavailable {
		available, availableReason, availableMsg = corev1.ConditionFalse, "MinimumReplicasUnavailable", "Deployment does not have minimum availability."
	}
	deadline := 600 * time.Second
	if d.Spec.ProgressDeadlineSeconds != nil {
		deadline = time.Duration(*d.Spec.ProgressDeadlineSeconds) * time.Second
	}
	progressing, progressReason := corev1.ConditionTrue, "ReplicaSetUpdated"
	progressMsg := fmt.Sprintf("Deployment %q is progressing: %d of %d updated replicas are available.", d.Name, c.Ready, desired)
	switch {
	case Complete(c):
		progressReason, progressMsg = "NewReplicaSetAvailable", fmt.Sprintf("Deployment %q has successfully progressed.", d.Name)
	case !d.Spec.Paused && now.Sub(lastProgress) > deadline:
		progressing, progressReason = corev1.ConditionFalse, "ProgressDeadlineExceeded"
		progressMsg = fmt.Sprintf("Deployment %q has timed out progressing: no replica of the current spec appeared or became ready for %v.", d.Name, deadline)
	}
	st.Conditions = []appsv1.DeploymentCondition{
		{Type: appsv1.DeploymentAvailable, Status: available, Reason: availableReason, Message: availableMsg},
		{Type: appsv1.DeploymentProgressing, Status: progressing, Reason: progressReason, Message: progressMsg},
	}
	return st
}
