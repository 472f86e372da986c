package reconcile

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// maxIDLen is containerd's limit on identifiers (containerd/identifiers).
const maxIDLen = 76

// ReplicaName returns the user-facing name of a Deployment replica:
// "<workload>-<hash>-<ordinal>", like Kubernetes'
// "<name>-<pod-template-hash>-<suffix>" (hash: see NewReplica).
func ReplicaName(workload, hash string, ordinal int) string {
	return workload + "-" + hash + "-" + strconv.Itoa(ordinal)
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

// MemberID returns the containerd ID of container name of the replica
// whose container ID is id: "<id>.<name>" (neither a replica's ID nor a
// container name holds a dot), cut as ContainerID cuts.
func MemberID(id, name string) string {
	m := id + "." + name
	if len(m) <= maxIDLen {
		return m
	}
	sum := sha256.Sum256([]byte(m))
	return m[:maxIDLen-9] + "-" + hex.EncodeToString(sum[:4])
}

// NewReplica fills in a Replica's names for one ordinal of a workload
// whose object has the UID uid ("" for one stored before Starling gave
// objects UIDs). The name's hash is the spec hash mixed with the UID
// (nameHash), so the replicas of an object deleted and applied again
// under the same name are new containers: they neither wait for their
// predecessors to stop nor show their logs.
func NewReplica(namespace, workload, specHash, uid string, ordinal int, spec Spec) Replica {
	name := ReplicaName(workload, nameHash(specHash, uid), ordinal)
	return Replica{
		ID:        ContainerID(namespace, name),
		Name:      name,
		Namespace: namespace,
		Workload:  workload,
		UID:       uid,
		Ordinal:   ordinal,
		SpecHash:  specHash,
		Spec:      spec,
	}
}

// nameHash is the hash in a Deployment replica's name: specHash itself
// for an object without a UID, else the first 8 hex characters of the
// SHA-256 of "<specHash>/<uid>".
func nameHash(specHash, uid string) string {
	if uid == "" {
		return specHash
	}
	sum := sha256.Sum256([]byte(specHash + "/" + uid))
	return hex.EncodeToString(sum[:4])
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
