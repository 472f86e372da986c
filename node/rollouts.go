package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/rollout"
)

// revisionRecords returns the live revision records of Deployment
// namespace/name, decoded, with the store records they came from (same
// order). Records that do not decode or belong to another Deployment
// sharing the key prefix are skipped.
func (a *Agent) revisionRecords(namespace, name string) ([]api.Revision, []crdt.Record, error) {
	recs, err := a.store.List(rollout.Prefix(namespace, name))
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
				a.log.Error("stored revision does not decode; skipped", "key", rec.Key, "err", err)
			}
			continue
		}
		revs = append(revs, r)
		live = append(live, rec)
	}
	return revs, live, nil
}

// revisionChanges returns the records that make d's revisions follow d
// (rollout.Record): new or renumbered revisions and tombstones of pruned
// ones, with versions that win over the records they replace.
func (a *Agent) revisionChanges(d *appsv1.Deployment) ([]crdt.Record, error) {
	revs, stored, err := a.revisionRecords(d.Namespace, d.Name)
	if err != nil {
		return nil, err
	}
	for _, rec := range stored {
		a.clock.Update(rec.Version)
	}
	ch := rollout.Record(revs, d, time.Now())
	var out []crdt.Record
	for _, r := range ch.Put {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("encode revision %d of %s: %w", r.Revision, d.Name, err)
		}
		out = append(out, crdt.Record{Key: rollout.Key(r.Namespace, r.Deployment, r.SpecHash), Value: b, Version: a.clock.Now(), Origin: a.cfg.Name})
	}
	for _, r := range ch.Drop {
		out = append(out, crdt.Record{Key: rollout.Key(r.Namespace, r.Deployment, r.SpecHash), Version: a.clock.Now(), Origin: a.cfg.Name, Deleted: true})
	}
	return out, nil
}

// deleteRevisions tombstones every revision of Deployment namespace/name.
func (a *Agent) deleteRevisions(namespace, name string) error {
	_, stored, err := a.revisionRecords(namespace, name)
	if err != nil {
		return err
	}
	var tombs []crdt.Record
	for _, rec := range stored {
		a.clock.Update(rec.Version)
		tombs = append(tombs, crdt.Record{Key: rec.Key, Version: a.clock.Now(), Origin: a.cfg.Name, Deleted: true})
	}
	return a.publish(tombs...)
}

// deploymentAt returns the live Deployment the request's {namespace} and
// {name} name, with an HTTP status for the error.
func (a *Agent) deploymentAt(r *http.Request) (manifest.Object, int, error) {
	r.SetPathValue("kind", "deployment")
	rec, status, err := a.lookup(r)
	if err != nil {
		return manifest.Object{}, status, err
	}
	o, err := manifest.Decode(rec.Value)
	if err != nil {
		return manifest.Object{}, http.StatusInternalServerError, fmt.Errorf("stored deployment %s: %w", rec.Key, err)
	}
	return o, http.StatusOK, nil
}

// liveReplicas is every replica copy that live nodes report in their
// status records: the input of rollout.Count.
func liveReplicas(v *view) []api.Replica {
	var out []api.Replica
	for name, s := range v.statuses {
		if v.alive[name] {
			out = append(out, s.Replicas...)
		}
	}
	return out
}

func (a *Agent) handleRolloutStatus(w http.ResponseWriter, r *http.Request) {
	o, status, err := a.deploymentAt(r)
	if err != nil {
		writeError(w, status, err)
		return
	}
	v := a.view()
	revs, _, err := a.revisionRecords(o.Namespace, o.Name)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, rolloutStatus(o.Deployment, revs, liveReplicas(v)))
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

func (a *Agent) handleRolloutHistory(w http.ResponseWriter, r *http.Request) {
	o, status, err := a.deploymentAt(r)
	if err != nil {
		writeError(w, status, err)
		return
	}
	revs, _, err := a.revisionRecords(o.Namespace, o.Name)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	rollout.SortNewestFirst(revs)
	out := api.RevisionList{Items: make([]api.Revision, 0, len(revs))}
	for i := len(revs) - 1; i >= 0; i-- {
		out.Items = append(out.Items, revs[i])
	}
	writeJSON(w, http.StatusOK, out)
}

// errConflict is a change refused because of the Deployment's state
// (paused, already paused, ...): HTTP 409.
type errConflict struct{ msg string }

func (e errConflict) Error() string { return e.msg }

// changeDeployment loads the request's Deployment, lets change edit it
// and stores it as a new generation, answering with an ApplyResult whose
// Result is what change returns. change returning result with no error
// and no edit (skip) answers without writing.
func (a *Agent) changeDeployment(w http.ResponseWriter, r *http.Request, change func(o manifest.Object) (result string, skip bool, err error)) {
	o, status, err := a.deploymentAt(r)
	if err != nil {
		writeError(w, status, err)
		return
	}
	result, skip, err := change(o)
	var conflict errConflict
	switch {
	case errors.As(err, &conflict):
		writeError(w, http.StatusConflict, err)
		return
	case errors.Is(err, rollout.ErrNoRevision):
		writeError(w, http.StatusNotFound, fmt.Errorf("deployment %q: %w (see 'starling rollout history deployment/%s')", o.Name, err, o.Name))
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	if !skip {
		if errs := manifest.Validate(o); len(errs) > 0 {
			writeError(w, http.StatusUnprocessableEntity, errs.ToAggregate())
			return
		}
		if _, err := a.applyObjects([]manifest.Object{o}); err != nil {
			writeError(w, http.StatusInternalServerError, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, api.ApplyResult{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name, Result: result})
}

func (a *Agent) handleRolloutUndo(w http.ResponseWriter, r *http.Request) {
	var req api.UndoRequest
	b, err := readBody(w, r, 4096)
	if err == nil {
		err = json.Unmarshal(b, &req)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("undo: request body: %w", err))
		return
	}
	if req.ToRevision < 0 {
		writeError(w, http.StatusBadRequest, fmt.Errorf("toRevision %d: must be 0 (the previous revision) or a revision number", req.ToRevision))
		return
	}
	a.changeDeployment(w, r, func(o manifest.Object) (string, bool, error) {
		d := o.Deployment
		if d.Spec.Paused {
			return "", false, errConflict{fmt.Sprintf("deployment %q is paused: a paused deployment cannot be rolled back; resume it first with 'starling rollout resume deployment/%s'", d.Name, d.Name)}
		}
		revs, _, err := a.revisionRecords(d.Namespace, d.Name)
		if err != nil {
			return "", false, err
		}
		target, err := rollout.Target(revs, manifest.SpecHash(d), req.ToRevision)
		if err != nil {
			return "", false, err
		}
		if target.SpecHash == manifest.SpecHash(d) {
			return fmt.Sprintf("skipped rollback (current template already matches revision %d)", target.Revision), true, nil
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
		return "rolled back", false, nil
	})
}

func (a *Agent) handleRolloutRestart(w http.ResponseWriter, r *http.Request) {
	a.changeDeployment(w, r, func(o manifest.Object) (string, bool, error) {
		d := o.Deployment
		if d.Spec.Paused {
			return "", false, errConflict{fmt.Sprintf("deployment %q is paused: a paused deployment cannot be restarted; resume it first with 'starling rollout resume deployment/%s'", d.Name, d.Name)}
		}
		if d.Spec.Template.Annotations == nil {
			d.Spec.Template.Annotations = map[string]string{}
		}
		// RFC 3339 to the second, as kubectl writes it; a second restart
		// within the same second changes nothing.
		d.Spec.Template.Annotations[manifest.RestartedAtAnnotation] = time.Now().UTC().Format(time.RFC3339)
		return "restarted", false, nil
	})
}

func (a *Agent) handleRolloutPause(w http.ResponseWriter, r *http.Request) {
	a.changeDeployment(w, r, func(o manifest.Object) (string, bool, error) {
		if o.Deployment.Spec.Paused {
			return "", false, errConflict{fmt.Sprintf("deployment %q is already paused", o.Name)}
		}
		o.Deployment.Spec.Paused = true
		return "paused", false, nil
	})
}

func (a *Agent) handleRolloutResume(w http.ResponseWriter, r *http.Request) {
	a.changeDeployment(w, r, func(o manifest.Object) (string, bool, error) {
		if !o.Deployment.Spec.Paused {
			return "", false, errConflict{fmt.Sprintf("deployment %q is not paused", o.Name)}
		}
		o.Deployment.Spec.Paused = false
		return "resumed", false, nil
	})
}
