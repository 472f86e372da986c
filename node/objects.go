package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/dustin/go-humanize"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
	"github.com/starling-orchestrator/starling/node/ingress"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/member"
	"github.com/starling-orchestrator/starling/node/sealed"
	"github.com/starling-orchestrator/starling/node/view"
)

// objects is the desired state as the API reads and writes it: apply,
// get, list, delete, scale and the rollout commands (rollouts.go). Every
// write is signed, stored and gossiped (publish), then the view is
// rebuilt before the answer, so a client reads its own writes. It
// implements apiserver.Objects.
type objects struct {
	self        string
	serviceCIDR string
	st          Store
	clock       *hlc.Clock
	views       *view.Builder
	writer      *writer
	box         *sealed.Box // Secrets are stored sealed
	log         *slog.Logger
}

var _ apiserver.Objects = (*objects)(nil)

// Apply stores validated objects as new versions, all or none: a
// Deployment and a StatefulSet of one name clash (409), and what
// validating each object alone cannot check (size, Service addresses and
// ports) is checked first (422).
func (o *objects) Apply(objs []manifest.Object) ([]api.ApplyResult, error) {
	if err := o.workloadClash(objs); err != nil {
		return nil, api.NewError(http.StatusConflict, err)
	}
	return o.write(objs, true, func() error { return o.admit(objs) })
}

// lookup returns the live record of kind namespace/name; 404 when none.
func (o *objects) lookup(kind, namespace, name string) (crdt.Record, error) {
	rec, found, err := o.st.Get(manifest.KeyFor(kind, namespace, name))
	if err != nil {
		return rec, err
	}
	if !found || rec.Deleted {
		return rec, api.Errorf(http.StatusNotFound, "%s %q not found in namespace %q", strings.ToLower(kind), name, namespace)
	}
	return rec, nil
}

// List returns the live objects of kind; Services show their allocated
// ClusterIP and NodePorts.
func (o *objects) List(kind string) ([]api.Object, error) {
	recs, err := o.st.List(view.KindPrefix(kind))
	if err != nil {
		return nil, err
	}
	out := []api.Object{}
	for _, rec := range recs {
		if !rec.Deleted {
			if obj, err := o.apiObject(rec); err == nil {
				out = append(out, obj)
			} else {
				o.log.Warn("a stored object does not open; it is left out of lists", "err", err)
			}
		}
	}
	o.decorate(kind, out)
	return out, nil
}

// decorate fills in what the view knows of items, objects of kind: a
// Service's ClusterIP and NodePorts, a claim's status.
func (o *objects) decorate(kind string, items []api.Object) {
	switch kind {
	case manifest.KindService:
		view.DecorateServices(o.views.View().Alloc, items)
	case manifest.KindPersistentVolumeClaim:
		view.DecorateClaims(items, o.views.View().VolumeClaims)
	case manifest.KindIngress:
		ingress.Decorate(o.views.View(), items)
	}
}

// Get returns one live object.
func (o *objects) Get(kind, namespace, name string) (api.Object, error) {
	rec, err := o.lookup(kind, namespace, name)
	if err != nil {
		return api.Object{}, err
	}
	obj, err := o.apiObject(rec)
	if err != nil {
		return api.Object{}, err
	}
	items := []api.Object{obj}
	o.decorate(kind, items)
	return items[0], nil
}

// Delete writes a tombstone for one object (and its revisions); a claim
// in use is marked for deletion instead (view.DeleteClaim).
func (o *objects) Delete(kind, namespace, name string) (api.ApplyResult, error) {
	rec, err := o.lookup(kind, namespace, name)
	if err != nil {
		return api.ApplyResult{}, err
	}
	if obj, err := manifest.Decode(rec.Value); err == nil && obj.Claim != nil {
		users := view.ClaimUsers(o.views.View(), namespace, name)
		if obj, held := view.DeleteClaim(obj, users, time.Now()); held {
			_, err := o.store([]manifest.Object{obj})
			return api.ApplyResult{Kind: kind, Namespace: namespace, Name: name, Result: "deletion requested: in use by " + strings.Join(users, ", ") +
				"; deleted once no replica mounts it"}, err
		}
	}
	o.clock.Update(rec.Version) // the tombstone must win over what it deletes
	tomb := crdt.Record{Key: rec.Key, Version: o.clock.Now(), Origin: o.self, Deleted: true}
	if err := o.writer.PublishDurable(tomb); err != nil {
		return api.ApplyResult{}, fmt.Errorf("store: %w", err)
	}
	o.views.Rebuild(time.Now()) // read your writes, as store
	if kind == manifest.KindDeployment {
		if err := o.deleteRevisions(namespace, name); err != nil {
			return api.ApplyResult{}, fmt.Errorf("delete revisions: %w", err)
		}
	}
	return api.ApplyResult{Kind: kind, Namespace: namespace, Name: name, Result: "deleted"}, nil
}

// Scale sets the replicas of a Deployment or StatefulSet.
func (o *objects) Scale(kind, namespace, name string, replicas int32) (api.ApplyResult, error) {
	rec, err := o.lookup(kind, namespace, name)
	if err != nil {
		return api.ApplyResult{}, err
	}
	obj, err := manifest.Decode(rec.Value)
	if err != nil {
		return api.ApplyResult{}, err
	}
	switch {
	case obj.Deployment != nil:
		obj.Deployment.Spec.Replicas = &replicas
	case obj.StatefulSet != nil:
		obj.StatefulSet.Spec.Replicas = &replicas
	default:
		return api.ApplyResult{}, api.Errorf(http.StatusBadRequest, "scale: %s is not a Deployment or StatefulSet", obj.Key())
	}
	if errs := manifest.Validate(obj); len(errs) > 0 {
		return api.ApplyResult{}, api.NewError(http.StatusUnprocessableEntity, errs.ToAggregate())
	}
	if _, err := o.store([]manifest.Object{obj}); err != nil {
		return api.ApplyResult{}, err
	}
	return api.ApplyResult{Kind: obj.Kind, Namespace: obj.Namespace, Name: obj.Name, Result: "scaled"}, nil
}

// ReleaseClaim gives up the data of a claim whose node is gone
// (view.ReleaseClaim).
func (o *objects) ReleaseClaim(namespace, name string) (api.ApplyResult, error) {
	rec, err := o.lookup(manifest.KindPersistentVolumeClaim, namespace, name)
	if err != nil {
		return api.ApplyResult{}, err
	}
	obj, err := manifest.Decode(rec.Value)
	if err != nil {
		return api.ApplyResult{}, err
	}
	o.views.Rebuild(time.Now()) // membership as it is now: a node just found dead
	obj, node, err := view.ReleaseClaim(obj, o.views.View())
	if err != nil {
		return api.ApplyResult{}, api.NewError(http.StatusConflict, err)
	}
	if _, err := o.store([]manifest.Object{obj}); err != nil {
		return api.ApplyResult{}, err
	}
	return api.ApplyResult{Kind: obj.Kind, Namespace: namespace, Name: name, Result: "released from node " + node}, nil
}

// store is write without further checks (scale, rollout commands and
// tests).
func (o *objects) store(objs []manifest.Object) ([]api.ApplyResult, error) {
	return o.write(objs, false, nil)
}

// write stores objects as new versions and gossips them, each as
// manifest.Apply decides over the stored one (created, configured, or
// unchanged and left alone), after kubectl's three-way merge with it
// when merge is set (an apply: manifest.Merge), all or none: an object whose encoding is
// over api.MaxObjectBytes, or an error from admit (nil: none), stores
// nothing (422, every problem listed). Each object is encoded once, by
// manifest.Apply, and the size checked is that of what is stored.
// A Deployment's revision records follow its template (rollout.Record),
// unchanged ones too (which records a Deployment stored before revisions
// existed); they are written before the objects, so a node that sees a
// new template has mostly seen its revision already.
func (o *objects) write(objs []manifest.Object, merge bool, admit func() error) ([]api.ApplyResult, error) {
	var recs, revRecs []crdt.Record
	var errs []error
	results := make([]api.ApplyResult, len(objs))
	for i, obj := range objs {
		results[i] = api.ApplyResult{Kind: obj.Kind, Namespace: obj.Namespace, Name: obj.Name}
		stored, found, err := o.st.Get(obj.Key())
		if err != nil {
			return nil, err
		}
		if found {
			o.clock.Update(stored.Version) // the new version must win over the old
		}
		var old []byte
		if found && !stored.Deleted {
			if old, err = o.open(stored); err != nil { // stored, even if empty: configured, not created
				return nil, err
			}
		}
		if merge { // an apply: kubectl's three-way merge over what is stored
			if obj, err = manifest.Merge(old, obj); err != nil {
				errs = append(errs, err)
				continue
			}
			objs[i] = obj // admit checks what is stored
		}
		if obj.Deployment != nil {
			rs, err := o.revisionChanges(obj.Deployment)
			if err != nil {
				return nil, fmt.Errorf("revisions of %s: %w", obj.Key(), err)
			}
			revRecs = append(revRecs, rs...)
		}
		value, result, err := manifest.Apply(old, obj, time.Now(), uuid.NewUUID())
		if errors.As(err, new(*manifest.ValidationError)) {
			errs = append(errs, err)
			continue
		} else if err != nil {
			return nil, err
		}
		if results[i].Result = result; value == nil {
			continue
		}
		if len(value) > api.MaxObjectBytes {
			errs = append(errs, fmt.Errorf("%s %s/%s: object is %s; the limit is %s: move large data out of the manifest (for example into the image)",
				obj.Kind, obj.Namespace, obj.Name, humanize.IBytes(uint64(len(value))), humanize.IBytes(api.MaxObjectBytes)))
		}
		if obj.Kind == manifest.KindSecret {
			if value, err = o.box.Seal(obj.Key(), value); err != nil {
				return nil, err
			}
		}
		recs = append(recs, crdt.Record{Key: obj.Key(), Value: value, Version: o.clock.Now(), Origin: o.self})
	}
	if admit != nil {
		if err := admit(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, api.NewError(http.StatusUnprocessableEntity, errors.Join(errs...))
	}
	if err := o.writer.PublishDurable(append(revRecs, recs...)...); err != nil {
		return nil, err
	}
	// Read your writes: reads through this node after the answer see the
	// change (the view loop would take up to its debounce).
	o.views.Rebuild(time.Now())
	return results, nil
}

// workloadClash refuses a Deployment and a StatefulSet of one name in one
// namespace: their replicas would share the workload's ordinals.
func (o *objects) workloadClash(objs []manifest.Object) error {
	var errs []error
	for _, obj := range objs {
		other := ""
		switch obj.Kind {
		case manifest.KindDeployment:
			other = manifest.KindStatefulSet
		case manifest.KindStatefulSet:
			other = manifest.KindDeployment
		default:
			continue
		}
		rec, found, err := o.st.Get(manifest.KeyFor(other, obj.Namespace, obj.Name))
		if err != nil {
			return err
		}
		if found && !rec.Deleted {
			errs = append(errs, fmt.Errorf("%s %s/%s: metadata.name: a %s of that name exists in the namespace; delete it first or choose another name",
				obj.Kind, obj.Namespace, obj.Name, other))
		}
	}
	return errors.Join(errs...)
}

// apiObject is a stored object as the API shows it, with who wrote it:
// the node that accepted the write, and the key its signature verified
// with (checked on arrival; this node's own key for its own writes).
// A Secret is shown opened: the API server hides its values
// (apiserver.Redact) unless asked for them.
func (o *objects) apiObject(rec crdt.Record) (api.Object, error) {
	value, err := o.open(rec)
	return api.Object{Object: value, Version: rec.Version.String(), Origin: rec.Origin, Signer: member.KeyID(rec.Signer)}, err
}

// open returns the value of rec in clear (a new slice): a Secret's
// opened (node/sealed), any other as stored.
func (o *objects) open(rec crdt.Record) ([]byte, error) {
	if strings.HasPrefix(rec.Key, view.KindPrefix(manifest.KindSecret)) {
		return o.box.Open(rec.Key, rec.Value)
	}
	return append([]byte{}, rec.Value...), nil
}
