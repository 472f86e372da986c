package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/rollout"
)

// storedRevisions returns the live revision records of Deployment
// namespace/name in st, decoded, with the store records they came from
// (same order). Records that do not decode or belong to another
// Deployment sharing the key prefix are skipped (and logged).
func storedRevisions(st Store, namespace, name string, log *slog.Logger) ([]api.Revision, []crdt.Record, error) {
	recs, err := st.List(rollout.Prefix(namespace, name))
	if err != nil {
		return nil, nil, err
	}
	var (
		revs []api.Revision
		live []crdt.Record
	)
	for _, rec := range recs {
		if rec.Deleted {
			continue
		}
		r, err := rollout.Decode(rec.Value)
		if err != nil || !rollout.Of(rec.Key, r, namespace, name) {
			if err != nil {
				log.Error("stored revision does not decode; skipped", "key", rec.Key, "err", err)
			}
			continue
		}
		if w := rec.Version.Time().UTC(); r.Created.After(w) {
			r.Created = w // dated after its write: capped, as node records' times are (view.CapTimes)
		}
		revs = append(revs, r)
		live = append(live, rec)
	}
	return revs, live, nil
}

// revisionChanges returns the records that make d's revisions follow d
// (rollout.Record): new or renumbered revisions and tombstones of pruned
// ones, with versions that win over the records they replace.
func (o *objects) revisionChanges(d *appsv1.Deployment) ([]crdt.Record, error) {
	revs, stored, err := storedRevisions(o.st, d.Namespace, d.Name, o.log)
	if err != nil {
		return nil, err
	}
	for _, rec := range stored {
		o.clock.Update(rec.Version)
	}
	ch := rollout.Record(revs, d, time.Now())
	var out []crdt.Record
	for _, r := range ch.Put {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("encode revision %d of %s: %w", r.Revision, d.Name, err)
		}
		out = append(out, crdt.Record{Key: rollout.Key(r.Namespace, r.Deployment, r.SpecHash), Value: b, Version: o.clock.Now(), Origin: o.self})
	}
	for _, r := range ch.Drop {
		out = append(out, crdt.Record{Key: rollout.Key(r.Namespace, r.Deployment, r.SpecHash), Version: o.clock.Now(), Origin: o.self, Deleted: true})
	}
	return out, nil
}

// deleteRevisions tombstones every revision of Deployment namespace/name.
func (o *objects) deleteRevisions(namespace, name string) error {
	_, stored, err := storedRevisions(o.st, namespace, name, o.log)
	if err != nil {
		return err
	}
	var tombs []crdt.Record
	for _, rec := range stored {
		o.clock.Update(rec.Version)
		tombs = append(tombs, crdt.Record{Key: rec.Key, Version: o.clock.Now(), Origin: o.self, Deleted: true})
	}
	return o.writer.PublishDurable(tombs...)
}

// deployment returns the live Deployment namespace/name (404 if none).
func (o *objects) deployment(namespace, name string) (manifest.Object, error) {
	rec, err := o.lookup(manifest.KindDeployment, namespace, name)
	if err != nil {
		return manifest.Object{}, err
	}
	obj, err := manifest.Decode(rec.Value)
	if err != nil {
		return manifest.Object{}, fmt.Errorf("stored deployment %s: %w", rec.Key, err)
	}
	return obj, nil
}

// RolloutStatus is the progress of Deployment namespace/name as this
// node sees the cluster.
func (o *objects) RolloutStatus(namespace, name string) (api.RolloutStatus, error) {
	obj, err := o.deployment(namespace, name)
	if err != nil {
		return api.RolloutStatus{}, err
	}
	revs, _, err := storedRevisions(o.st, namespace, name, o.log)
	if err != nil {
		return api.RolloutStatus{}, err
	}
	return rolloutStatus(obj.Deployment, revs, o.views.View().LiveReplicas()), nil
}

// rolloutStatus is the status answer for d from its revisions and the
// replica copies of live nodes.
func rolloutStatus(d *appsv1.Deployment, revs []api.Revision, reps []api.Replica) api.RolloutStatus {
	hash := manifest.SpecHash(d)
	st := api.RolloutStatus{Namespace: d.Namespace, Name: d.Name, Generation: d.Generation, SpecHash: hash,
		Paused: d.Spec.Paused, ProgressDeadlineSeconds: 600}
	if p := d.Spec.ProgressDeadlineSeconds; p != nil {
		st.ProgressDeadlineSeconds = *p
	}
	for _, rev := range revs {
		if rev.SpecHash == hash {
			st.Revision = rev.Revision
		}
	}
	st.RolloutCounts = rollout.Count(d.Namespace, d.Name, hash, manifest.Object{Deployment: d}.Replicas(), reps)
	st.Done = rollout.Complete(st.RolloutCounts)
	return st
}

// RolloutHistory is the revisions of Deployment namespace/name, oldest
// first.
func (o *objects) RolloutHistory(namespace, name string) ([]api.Revision, error) {
	if _, err := o.deployment(namespace, name); err != nil {
		return nil, err
	}
	revs, _, err := storedRevisions(o.st, namespace, name, o.log)
	if err != nil {
		return nil, err
	}
	rollout.SortNewestFirst(revs)
	out := make([]api.Revision, 0, len(revs))
	for i := len(revs) - 1; i >= 0; i-- {
		out = append(out, revs[i])
	}
	return out, nil
}

// Rollout runs a rollout command on Deployment namespace/name: it loads
// it, lets the command edit it and stores it as a new generation. A
// command refused by the Deployment's state (paused, already paused)
// is a 409; an undo to a revision that does not exist a 404.
func (o *objects) Rollout(cmd apiserver.RolloutCommand, namespace, name string, to int64) (api.ApplyResult, error) {
	obj, err := o.deployment(namespace, name)
	if err != nil {
		return api.ApplyResult{}, err
	}
	d := obj.Deployment
	conflict := func(format string, args ...any) (api.ApplyResult, error) {
		return api.ApplyResult{}, api.Errorf(http.StatusConflict, format, args...)
	}
	result := ""
	switch cmd {
	case apiserver.RolloutUndo:
		if d.Spec.Paused {
			return conflict("deployment %q is paused: a paused deployment cannot be rolled back; resume it first with 'starling rollout resume deployment/%s'", d.Name, d.Name)
		}
		revs, _, err := storedRevisions(o.st, d.Namespace, d.Name, o.log)
		if err != nil {
			return api.ApplyResult{}, err
		}
		target, err := rollout.Target(revs, manifest.SpecHash(d), to)
		if errors.Is(err, rollout.ErrNoRevision) {
			return api.ApplyResult{}, api.Errorf(http.StatusNotFound, "deployment %q: %v (see 'starling rollout history deployment/%s')", d.Name, err, d.Name)
		}
		if err != nil {
			return api.ApplyResult{}, err
		}
		if target.SpecHash == manifest.SpecHash(d) {
			return api.ApplyResult{Kind: obj.Kind, Namespace: obj.Namespace, Name: obj.Name,
				Result: fmt.Sprintf("skipped rollback (current template already matches revision %d)", target.Revision)}, nil
		}
		// As kubectl's rollback does: the template and the change cause
		// of the revision come back; replicas, strategy and the rest stay.
		d.Spec.Template = *target.Template.DeepCopy()
		if target.ChangeCause != "" {
			if d.Annotations == nil {
				d.Annotations = map[string]string{}
			}
			d.Annotations[rollout.ChangeCauseAnnotation] = target.ChangeCause
		} else {
			delete(d.Annotations, rollout.ChangeCauseAnnotation)
		}
		result = "rolled back"
	case apiserver.RolloutRestart:
		if d.Spec.Paused {
			return conflict("deployment %q is paused: a paused deployment cannot be restarted; resume it first with 'starling rollout resume deployment/%s'", d.Name, d.Name)
		}
		if d.Spec.Template.Annotations == nil {
			d.Spec.Template.Annotations = map[string]string{}
		}
		// RFC 3339 to the second, as kubectl writes it; a second restart
		// within the same second changes nothing.
		d.Spec.Template.Annotations[manifest.RestartedAtAnnotation] = time.Now().UTC().Format(time.RFC3339)
		result = "restarted"
	case apiserver.RolloutPause:
		if d.Spec.Paused {
			return conflict("deployment %q is already paused", d.Name)
		}
		d.Spec.Paused, result = true, "paused"
	case apiserver.RolloutResume:
		if !d.Spec.Paused {
			return conflict("deployment %q is not paused", d.Name)
		}
		d.Spec.Paused, result = false, "resumed"
	default:
		return api.ApplyResult{}, api.Errorf(http.StatusBadRequest, "rollout %q: want undo, restart, pause or resume", cmd)
	}
	if errs := manifest.Validate(obj); len(errs) > 0 {
		return api.ApplyResult{}, api.NewError(http.StatusUnprocessableEntity, errs.ToAggregate())
	}
	if _, err := o.store([]manifest.Object{obj}); err != nil {
		return api.ApplyResult{}, err
	}
	return api.ApplyResult{Kind: obj.Kind, Namespace: obj.Namespace, Name: obj.Name, Result: result}, nil
}
