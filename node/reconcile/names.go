package reconcile

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// maxIDLen is containerd's limit on identifiers (containerd/identifiers).
const maxIDLen = 76

// ReplicaName returns the user-facing name of a Deployment replica:
// "<workload>-<specHash>-<ordinal>", like Kubernetes' "<name>-<pod-template-hash>-<suffix>".
func ReplicaName(workload, specHash string, ordinal int) string {
	return workload + "-" + specHash + "-" + strconv.Itoa(ordinal)
}

// ContainerID returns the containerd container ID of a replica,
// "<namespace>_<name>". IDs longer than containerd's 76 characters are cut
// and suffixed with a hash of the whole, so they stay unique.
func ContainerID(namespace, name string) string {
	id := namespace + "_" + name
	if len(id) <= maxIDLen {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return id[:maxIDLen-9] + "-" + hex.EncodeToString(sum[:4])
}

// NewReplica fills in a Replica's names for one ordinal of a workload.
func NewReplica(namespace, workload, specHash string, ordinal int, spec Spec) Replica {
	name := ReplicaName(workload, specHash, ordinal)
	return Replica{
		ID:        ContainerID(namespace, name),
		Name:      name,
		Namespace: namespace,
		Workload:  workload,
		Ordinal:   ordinal,
		SpecHash:  specHash,
		Spec:      spec,
	}
}

// StatefulReplicaName returns the name of a StatefulSet replica:
// "<workload>-<ordinal>", stable across spec changes.
func StatefulReplicaName(workload string, ordinal int) string {
	return workload + "-" + strconv.Itoa(ordinal)
}

// NewStatefulReplica fills in a StatefulSet replica: stable name and ID,
// AtMostOne set.
func NewStatefulReplica(namespace, workload, specHash string, ordinal int, spec Spec) Replica {
	name := StatefulReplicaName(workload, ordinal)
	return Replica{
		ID:        ContainerID(namespace, name),
		Name:      name,
		Namespace: namespace,
		Workload:  workload,
		Ordinal:   ordinal,
		SpecHash:  specHash,
		Spec:      spec,
		AtMostOne: true,
	}
}
