// Package rollout holds the pure rules of Deployment rollouts: which
// revision records to keep when a Deployment is written (numbering and
// pruning as Kubernetes' deployment controller does it), which revision
// an undo goes back to, and how far a rollout has come (Count). It does no
// I/O: the agent reads and writes the records (node/objects.go, node/rollouts.go).
package rollout

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// Kind is the store kind of revision records: key
// "revision/<namespace>/<deployment>-<specHash>", value an api.Revision
// as JSON. One record per template hash, so re-applying an old template
// rewrites its record instead of adding one.
const Kind = "revision"

// ChangeCauseAnnotation is the Deployment annotation whose value a
// revision records as its change cause (as in Kubernetes).
const ChangeCauseAnnotation = "kubernetes.io/change-cause"

// DefaultHistoryLimit is spec.revisionHistoryLimit's default (apps/v1).
const DefaultHistoryLimit = 10

// ErrNoRevision is matched (errors.Is) by Target's *NoRevisionError.
var ErrNoRevision = errors.New("no such revision")

// NoRevisionError says an undo has no revision to go back to.
type NoRevisionError struct {
	// To is the revision asked for, 0 for "the previous one".
	To int64
	// Recorded are the revision numbers there are, ascending.
	Recorded []int64
}

func (e *NoRevisionError) Error() string {
	have := "none recorded"
	if len(e.Recorded) > 0 {
		nums := make([]string, len(e.Recorded))
		for i, n := range e.Recorded {
			nums[i] = strconv.FormatInt(n, 10)
		}
		have = "recorded: " + strings.Join(nums, ", ")
	}
	if e.To == 0 {
		return "no previous revision to roll back to (" + have + ")"
	}
	return fmt.Sprintf("unable to find revision %d in history (%s)", e.To, have)
}

// Is makes errors.Is(err, ErrNoRevision) true.
func (e *NoRevisionError) Is(target error) bool { return target == ErrNoRevision }

// Key is the store key of a Deployment's revision with hash specHash.
func Key(namespace, deployment, specHash string) string {
	return Kind + "/" + namespace + "/" + deployment + "-" + specHash
}

// Prefix is the store key prefix under which the revisions of deployment
// lie. Other Deployments' revisions may share it ("web" and "web-api"):
// filter what it lists with Of.
func Prefix(namespace, deployment string) string {
	return Kind + "/" + namespace + "/" + deployment + "-"
}

// Decode parses a revision record's value.
func Decode(value []byte) (api.Revision, error) {
	var r api.Revision
	if err := json.Unmarshal(value, &r); err != nil {
		return r, fmt.Errorf("decode revision: %w", err)
	}
	return r, nil
}

// Of reports whether the record stored at key holds a revision r of
// Deployment namespace/name (and is stored under its own key).
func Of(key string, r api.Revision, namespace, name string) bool {
	return r.Namespace == namespace && r.Deployment == name && r.SpecHash != "" &&
		key == Key(namespace, name, r.SpecHash)
}

// Change is what to write so that a Deployment's revision records follow
// a new version of it.
type Change struct {
	// Put are the revision records to write, new or updated.
	Put []api.Revision
	// Drop are the records to delete (tombstone): old revisions beyond
	// spec.revisionHistoryLimit.
	Drop []api.Revision
}

// Record returns the change to existing, the live revisions of d, that
// records d's current pod template, at now:
//
//   - a template hash new to d gets a revision numbered one above the
//     highest known;
//   - a hash d had before keeps its record (and creation time) but is
//     renumbered likewise, as Kubernetes renumbers the old ReplicaSet it
//     scales back up;
//   - the newest revision's template and change cause follow d (a label
//     or annotation change keeps the hash but is part of the template);
//   - of the other revisions only the newest spec.revisionHistoryLimit
//     (default 10) are kept, the older ones dropped.
//
// The change cause is d's ChangeCauseAnnotation; a renumbered revision
// keeps its own when d has none. Nothing changes when the records already
// say all this. existing may be in any order.
func Record(existing []api.Revision, d *appsv1.Deployment, now time.Time) Change {
	hash := manifest.SpecHash(d)
	cause := d.Annotations[ChangeCauseAnnotation]
	var (
		cur      *api.Revision
		maxOther int64
	)
	others := make([]api.Revision, 0, len(existing))
	for i := range existing {
		r := existing[i]
		if r.SpecHash == hash {
			cur = &r
			continue
		}
		others = append(others, r)
		maxOther = max(maxOther, r.Revision)
	}
	var ch Change
	next := api.Revision{Namespace: d.Namespace, Deployment: d.Name, SpecHash: hash,
		Created: now.UTC().Truncate(time.Second), Template: *d.Spec.Template.DeepCopy(), ChangeCause: cause}
	switch {
	case cur == nil:
		next.Revision = maxOther + 1
		ch.Put = append(ch.Put, next)
	case cur.Revision <= maxOther:
		next.Revision, next.Created = maxOther+1, cur.Created
		if cause == "" {
			next.ChangeCause = cur.ChangeCause
		}
		ch.Put = append(ch.Put, next)
	default:
		next.Revision, next.Created = cur.Revision, cur.Created
		if cause == "" {
			next.ChangeCause = cur.ChangeCause
		}
		if !sameRevision(*cur, next) {
			ch.Put = append(ch.Put, next)
		}
	}
	limit := DefaultHistoryLimit
	if l := d.Spec.RevisionHistoryLimit; l != nil {
		limit = int(*l)
	}
	SortNewestFirst(others)
	if len(others) > limit {
		ch.Drop = others[limit:]
	}
	return ch
}

// sameRevision reports whether a and b would be stored as equal records.
func sameRevision(a, b api.Revision) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}

// SortNewestFirst orders revisions by number, highest first; equal
// numbers (two nodes recording concurrently) by creation time, then hash,
// so every node orders them alike.
func SortNewestFirst(rs []api.Revision) {
	sort.Slice(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if a.Revision != b.Revision {
			return a.Revision > b.Revision
		}
		if !a.Created.Equal(b.Created) {
			return a.Created.After(b.Created)
		}
		return a.SpecHash > b.SpecHash
	})
}

// Target picks the revision an undo of a Deployment whose template hash
// is currentHash goes back to: revision to, or with to == 0 the newest
// revision with another hash (Kubernetes' "previous revision"). The error
// is a *NoRevisionError (errors.Is ErrNoRevision).
func Target(revisions []api.Revision, currentHash string, to int64) (api.Revision, error) {
	rs := append([]api.Revision(nil), revisions...)
	SortNewestFirst(rs)
	for _, r := range rs {
		if to == 0 && r.SpecHash != currentHash || to != 0 && r.Revision == to {
			return r, nil
		}
	}
	e := &NoRevisionError{To: to}
	for i := len(rs) - 1; i >= 0; i-- {
		e.Recorded = append(e.Recorded, rs[i].Revision)
	}
	return api.Revision{}, e
}
