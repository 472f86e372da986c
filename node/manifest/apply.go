package manifest

import (
	"bytes"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Results of an apply, as kubectl prints them.
const (
	Created    = "created"
	Configured = "configured"
	Unchanged  = "unchanged"
)

// Apply decides how obj is stored over old, the encoded object stored
// under its key (nil: none, or a tombstone), as a Kubernetes API
// server's create and update strategies do: the uid and
// creationTimestamp the API server sets are kept from old (an object
// stored before Starling gave UIDs keeps none: a new one would rename
// its replicas); a new object gets now (to the second, UTC) and uid;
// generation counts changes of the object. It returns the value to
// store (nil when unchanged) and Created, Configured or Unchanged. obj's
// own uid, creationTimestamp and generation are ignored. A pure
// function: the clock and the uid are given.
func Apply(old []byte, obj Object, now time.Time, uid types.UID) (value []byte, result string, err error) {
	meta := metaOf(&obj)
	meta.CreationTimestamp, meta.Generation, meta.UID = metav1.Time{}, 0, ""
	result = Created
	if old != nil {
		result = Configured
		if prev, err := Decode(old); err == nil {
			pm := metaOf(&prev)
			meta.CreationTimestamp, meta.Generation, meta.UID = pm.CreationTimestamp, pm.Generation, pm.UID
		}
		same, err := Encode(obj)
		if err != nil {
			return nil, "", err
		}
		if bytes.Equal(old, same) {
			return nil, Unchanged, nil
		}
	}
	if meta.CreationTimestamp.IsZero() {
		meta.CreationTimestamp = metav1.NewTime(now.UTC().Truncate(time.Second))
	}
	if result == Created {
		// A new object, also one applied again after a delete: its
		// replicas are not its predecessor's (reconcile.NewReplica).
		meta.UID = uid
	}
	meta.Generation++
	value, err = Encode(obj)
	return value, result, err
}

// metaOf is the object metadata of o's kind.
func metaOf(o *Object) *metav1.ObjectMeta {
	switch {
	case o.Deployment != nil:
		return &o.Deployment.ObjectMeta
	case o.StatefulSet != nil:
		return &o.StatefulSet.ObjectMeta
	}
	return &o.Service.ObjectMeta
}
