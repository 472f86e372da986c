package volumes

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/google/uuid"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

// ClaimSettle is how long a node's new binding of a claim stands, seen by
// its peers (it pins the claim's replicas to the node at once), before
// the node makes the volume: two nodes that bound one claim at once
// (each owned a replica that mounts it) learn within it which binding is
// the earliest, and the other gives it up before it made anything.
const ClaimSettle = 2 * time.Second

// Held is one of this node's bindings with the local time it was first
// published (At), for ClaimSettle.
type Held struct {
	Binding view.VolumeBinding
	At      time.Time
}

// ClaimPlan is what PlanClaims decides: the node's bindings from now
// on, the volumes (by claim UID) to make and those to remove, the claims
// to write (a StatefulSet ordinal's, made from its volumeClaimTemplates,
// or with its retention policy brought up to date) and those to delete
// (by "namespace/name").
type ClaimPlan struct {
	Next         []Held
	Make, Remove []string
	Write        []manifest.Object
	Delete       []string
}

// ClaimInputs are PlanClaims' inputs: this node's name, the claims as
// the view binds them (view.BindClaims) and the claims whose record is
// live whether it decodes or not (view.View.ClaimRecords), the
// workloads, the replicas this node owns, the claims its replicas mount
// (ClaimsInUse), its bindings held, now, and what gives a new binding's
// time.
type ClaimInputs struct {
	Self      string
	Claims    map[string]view.VolumeClaim
	Records   map[string]bool
	Workloads []manifest.Object
	Own       []reconcile.Replica
	Use       ClaimUse
	Held      []Held
	Now       time.Time
	Stamp     func() hlc.Timestamp
}

// Annotations of a claim made from a StatefulSet's volumeClaimTemplate:
// its StatefulSet and ordinal, and what its retention policy's
// whenDeleted says (kept up to date while the StatefulSet exists, as
// Kubernetes keeps the claims' owner references).
const (
	StatefulSetAnnotation = "starling.dev/statefulset"
	OrdinalAnnotation     = "starling.dev/ordinal"
	WhenDeletedAnnotation = "starling.dev/when-deleted"
)

// PlanClaims decides this node's bindings of PersistentVolumeClaims. A
// pure function:
//   - a claim that a replica this node owns mounts, and that no node
//     holds, is bound here (published, not made yet); a StatefulSet
//     ordinal's claim that does not exist is created first, from its
//     volumeClaimTemplate, as Kubernetes' StatefulSet controller does;
//   - a binding that has stood ClaimSettle and still wins
//     (view.BindClaims) is made (its directory) and Ready;
//   - a binding that another node's earlier one beats is given up: its
//     volume is removed when it was not made yet, and kept on disk, with
//     what a replica may have written, when it was;
//   - a binding of a claim deleted (its record a tombstone or gone), made
//     again (another UID) or released (view.Released) is given up, and
//     its volume removed once no replica this node lists and no longer
//     wants mounts the claim (Kubernetes' reclaim policy Delete, as the
//     local-path provisioner has it); a claim whose record does not
//     decode here (a newer version's) is left alone; a volume is never
//     removed while another claim of the view has its UID;
//   - a claim held here whose delete was asked
//     (manifest.DeletionRequestedAnnotation), or a StatefulSet's whose
//     StatefulSet is gone under whenDeleted Delete or whose ordinal is
//     scaled away under whenScaled Delete, is deleted once no replica
//     here mounts it (the default Retain keeps them).
func PlanClaims(in ClaimInputs) ClaimPlan {
	var p ClaimPlan
	mine := map[string]bool{} // by "namespace/claim"
	uids := map[string]string{}
	for key, c := range in.Claims {
		uids[string(c.Object.Claim.UID)] = key
	}
	remove := func(uid, key string) {
		if other := uids[uid]; other == "" || other == key {
			p.Remove = append(p.Remove, uid)
		}
	}
	for _, h := range in.Held {
		b := h.Binding
		key := b.Namespace + "/" + b.Claim
		c, ok := in.Claims[key]
		gone := ok && (string(c.Object.Claim.UID) != b.UID || view.Released(c.Object, b)) || !ok && !in.Records[key]
		switch {
		case !ok && !gone: // its record does not decode here: left alone
			p.Next = append(p.Next, h)
			mine[key] = true
			continue
		case gone && in.Use.used(in.Use.Stopping, key):
			p.Next = append(p.Next, h) // given up once no replica here mounts it
			continue
		case gone:
			remove(b.UID, key)
			continue
		case c.Node != "" && c.Node != in.Self:
			if !b.Ready {
				remove(b.UID, key)
			}
			continue
		}
		mine[key] = true
		b.Capacity = storageOf(c.Object.Claim)
		if !b.Ready && c.Node == in.Self && in.Now.Sub(h.At) >= ClaimSettle {
			b.Ready = true
			p.Make = append(p.Make, b.UID)
		}
		p.Next = append(p.Next, Held{Binding: b, At: h.At})
		if c.Node != in.Self {
			continue
		}
		deleting := c.Object.Claim.Annotations[manifest.DeletionRequestedAnnotation] != ""
		if !in.Use.used(in.Use.All, key) && (deleting || retired(c.Object, in.Workloads)) {
			p.Delete = append(p.Delete, key)
		} else if obj, stale := currentPolicy(c.Object, in.Workloads); stale {
			p.Write = append(p.Write, obj)
		}
	}
	written := map[string]bool{}
	for _, r := range in.Own {
		for _, vol := range r.Spec.Volumes {
			name := vol.ClaimName(r)
			key := r.Namespace + "/" + name
			c, ok := in.Claims[key]
			switch {
			case name == "" || mine[key]:
				continue
			case !ok && !in.Records[key] && vol.ClaimTemplate && !written[key]:
				if obj, ok := claimFromTemplate(in.Workloads, r, vol.Claim); ok {
					p.Write = append(p.Write, obj)
					written[key] = true
				}
				continue
			case !ok || c.Node != "" || !ValidUID(string(c.Object.Claim.UID)) || c.Object.Claim.Annotations[manifest.DeletionRequestedAnnotation] != "":
				continue
			}
			mine[key] = true
			since := in.Stamp()
			if mark, ok := view.ReleaseMark(c.Object); ok && since.Compare(mark) <= 0 {
				since = hlc.Timestamp{Wall: mark.Wall, Logical: mark.Logical + 1} // after the release, whatever this clock says
			}
			p.Next = append(p.Next, Held{At: in.Now, Binding: view.VolumeBinding{Namespace: r.Namespace, Claim: name,
				UID: string(c.Object.Claim.UID), Since: since, Capacity: storageOf(c.Object.Claim)}})
		}
	}
	return p
}

// ClaimUse is which claims ("namespace/claim") this node's replicas
// mount: All of those it owns or lists in its record, Stopping of those
// it lists and no longer owns (a replica whose Deployment was deleted,
// in its grace period). "namespace/*" stands for every claim of a
// namespace where the node lists a replica of a workload the view no
// longer holds (what it mounts is not known).
type ClaimUse struct {
	All, Stopping map[string]bool
}

// used reports whether m (a ClaimUse map) holds claim key.
func (ClaimUse) used(m map[string]bool, key string) bool {
	ns, _, _ := strings.Cut(key, "/")
	return m[key] || m[ns+"/*"]
}

// currentPolicy returns claim obj with WhenDeletedAnnotation set to its
// StatefulSet's current whenDeleted, and whether that differs from what
// obj holds (false for a claim of no StatefulSet the view holds).
func currentPolicy(obj manifest.Object, workloads []manifest.Object) (manifest.Object, bool) {
	name, ok := obj.Claim.Annotations[StatefulSetAnnotation]
	i := slices.IndexFunc(workloads, func(o manifest.Object) bool {
		return o.StatefulSet != nil && o.Namespace == obj.Namespace && o.Name == name
	})
	if !ok || i < 0 {
		return obj, false
	}
	want := string(appsv1.RetainPersistentVolumeClaimRetentionPolicyType)
	if rp := workloads[i].StatefulSet.Spec.PersistentVolumeClaimRetentionPolicy; rp != nil {
		want = string(rp.WhenDeleted)
	}
	if obj.Claim.Annotations[WhenDeletedAnnotation] == want {
		return obj, false
	}
	c := obj.Claim.DeepCopy()
	c.Annotations[WhenDeletedAnnotation] = want
	obj.Claim = c
	return obj, true
}

// claimFromTemplate is the claim of replica r's ordinal from template
// tpl of its StatefulSet (ok false when the StatefulSet or the template
// is not among workloads): named TEMPLATE-STATEFULSET-ORDINAL, labelled
// with the template's labels and the StatefulSet's selector, annotated
// with its StatefulSet, ordinal and whenDeleted policy.
func claimFromTemplate(workloads []manifest.Object, r reconcile.Replica, tpl string) (manifest.Object, bool) {
	i := slices.IndexFunc(workloads, func(o manifest.Object) bool {
		return o.StatefulSet != nil && o.Namespace == r.Namespace && o.Name == r.Workload
	})
	if i < 0 {
		return manifest.Object{}, false
	}
	sts := workloads[i].StatefulSet
	j := slices.IndexFunc(sts.Spec.VolumeClaimTemplates, func(c corev1.PersistentVolumeClaim) bool { return c.Name == tpl })
	if j < 0 {
		return manifest.Object{}, false
	}
	c := sts.Spec.VolumeClaimTemplates[j].DeepCopy()
	c.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: manifest.KindPersistentVolumeClaim}
	c.Name, c.Namespace = reconcile.TemplateClaimName(tpl, r.Workload, r.Ordinal), r.Namespace
	c.Labels = maps.Clone(c.Labels)
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	if sel := sts.Spec.Selector; sel != nil {
		maps.Copy(c.Labels, sel.MatchLabels)
	}
	c.Annotations = maps.Clone(c.Annotations)
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[StatefulSetAnnotation] = r.Workload
	c.Annotations[OrdinalAnnotation] = strconv.Itoa(r.Ordinal)
	c.Annotations[WhenDeletedAnnotation] = string(appsv1.RetainPersistentVolumeClaimRetentionPolicyType)
	if rp := sts.Spec.PersistentVolumeClaimRetentionPolicy; rp != nil {
		c.Annotations[WhenDeletedAnnotation] = string(rp.WhenDeleted)
	}
	return manifest.Object{Kind: manifest.KindPersistentVolumeClaim, Namespace: c.Namespace, Name: c.Name, Claim: c}, true
}

// retired reports whether claim obj, made from a StatefulSet's template,
// is to be deleted by its retention policy: its StatefulSet gone with
// whenDeleted Delete, or its ordinal scaled away with whenScaled Delete.
func retired(obj manifest.Object, workloads []manifest.Object) bool {
	ann := obj.Claim.Annotations
	name, ok := ann[StatefulSetAnnotation]
	if !ok {
		return false
	}
	i := slices.IndexFunc(workloads, func(o manifest.Object) bool {
		return o.StatefulSet != nil && o.Namespace == obj.Namespace && o.Name == name
	})
	if i < 0 {
		return ann[WhenDeletedAnnotation] == string(appsv1.DeletePersistentVolumeClaimRetentionPolicyType)
	}
	ord, err := strconv.Atoi(ann[OrdinalAnnotation])
	rp := workloads[i].StatefulSet.Spec.PersistentVolumeClaimRetentionPolicy
	return err == nil && ord >= workloads[i].Replicas() && rp != nil && rp.WhenScaled == appsv1.DeletePersistentVolumeClaimRetentionPolicyType
}

// ValidUID reports whether uid is a claim UID a volume may be named by:
// a UUID in its 36-character form, as the API gives (a record from a peer
// is untrusted: its UID names a directory).
func ValidUID(uid string) bool {
	_, err := uuid.Parse(uid)
	return err == nil && len(uid) == 36
}

// ClaimsInUse is which claims the replicas this node owns (own) or
// lists in its record mount (ClaimUse).
func ClaimsInUse(self string, v *view.View, own []reconcile.Replica) ClaimUse {
	u := ClaimUse{All: map[string]bool{}, Stopping: map[string]bool{}}
	wanted := map[string]bool{}
	for _, r := range own {
		wanted[r.Namespace+"/"+r.Name] = true
		for _, vol := range r.Spec.Volumes {
			if name := vol.ClaimName(r); name != "" {
				u.All[r.Namespace+"/"+name] = true
			}
		}
	}
	byKey := map[string]manifest.Object{}
	for _, o := range v.Workloads {
		byKey[o.Namespace+"/"+o.Name] = o
	}
	for _, r := range v.Statuses[self].Replicas {
		marks := []map[string]bool{u.All}
		if !wanted[r.Namespace+"/"+r.Name] {
			marks = append(marks, u.Stopping)
		}
		var names []string
		o, ok := byKey[r.Namespace+"/"+r.Workload]
		switch {
		case !ok || !o.IsWorkload():
			names = []string{"*"}
		case o.StatefulSet != nil:
			for _, t := range o.StatefulSet.Spec.VolumeClaimTemplates {
				names = append(names, reconcile.TemplateClaimName(t.Name, r.Workload, r.Ordinal))
			}
			fallthrough
		default:
			names = append(names, manifest.ClaimsOf(&o.PodTemplate().Spec)...)
		}
		for _, m := range marks {
			for _, n := range names {
				m[r.Namespace+"/"+n] = true
			}
		}
	}
	return u
}

func storageOf(c *corev1.PersistentVolumeClaim) int64 {
	q := c.Spec.Resources.Requests[corev1.ResourceStorage]
	return q.Value()
}

// ClaimObjects stores and deletes claim objects (the agent's API
// objects: validated and gossiped as an apply or a delete is).
type ClaimObjects interface {
	Apply(objs []manifest.Object) ([]api.ApplyResult, error)
	Delete(kind, namespace, name string) (api.ApplyResult, error)
}

// ClaimDir is the directory of the volume of claim UID uid under dir
// (--data-dir/volumes): "<dir>/<uid>/data", beside the binding it was
// made for ("binding.json").
func ClaimDir(dir, uid string) string { return filepath.Join(dir, uid, "data") }

// Binder keeps this node's bindings of PersistentVolumeClaims
// (PlanClaims) and their volumes on disk: it makes and removes the
// directories, measures what they hold, and has the node's record
// published when its bindings change. Its volumes made before an agent
// restart are read back from disk.
type Binder struct {
	Self string
	// Dir holds one directory per volume (ClaimDir).
	Dir   string
	Views Views
	// Clock gives a new binding's time (the node's hybrid clock);
	// Republish asks for the node's record to be published again (a
	// send that does not wait: the request coalesces).
	Clock     interface{ Now() hlc.Timestamp }
	Republish chan<- struct{}
	// Objects creates and deletes StatefulSets' claims (nil: none).
	Objects ClaimObjects
	Log     *slog.Logger

	loaded sync.Once
	mu     sync.Mutex
	held   []Held
}

// Bindings are the bindings this node's record lists (none from a nil
// Binder). The volumes made before this run are read back from disk
// first: a record published before would say this node holds none, and
// its claims' replicas would be placed elsewhere, empty.
func (b *Binder) Bindings() []view.VolumeBinding {
	if b == nil {
		return nil
	}
	b.loaded.Do(b.load)
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]view.VolumeBinding, 0, len(b.held))
	for _, h := range b.held {
		out = append(out, h.Binding)
	}
	return out
}

// usageEvery is how often the used bytes of the volumes are measured.
const usageEvery = 30 * time.Second

// Run binds, makes and removes volumes on each new view, every second
// while a binding waits for its settle (ClaimSettle), and measures the
// volumes every usageEvery while it holds some, until ctx ends. A node
// that holds no claim wakes only for new views.
func (b *Binder) Run(ctx context.Context) {
	b.loaded.Do(b.load)
	var measured time.Time
	for {
		changed := b.Sync(time.Now())
		if time.Since(measured) >= usageEvery {
			changed = b.measure() || changed
			measured = time.Now()
		}
		if changed && b.Republish != nil {
			select {
			case b.Republish <- struct{}{}:
			default: // one is pending already
			}
		}
		var wake <-chan time.Time
		switch held, settling := b.holding(); {
		case settling:
			wake = time.After(time.Second)
		case held:
			wake = time.After(time.Until(measured.Add(usageEvery)))
		}
		select {
		case <-ctx.Done():
			return
		case <-b.Views.Changed():
		case <-wake:
		}
	}
}

// holding reports whether the node holds bindings, and whether one of
// them waits for its settle.
func (b *Binder) holding() (held, settling bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range b.held {
		settling = settling || !h.Binding.Ready
	}
	return len(b.held) > 0, settling
}

// Sync applies one PlanClaims at now; it reports whether the bindings
// changed. It decides nothing on a view of a node that does not hold the
// cluster's state yet (view.View.Synced): a claim it has not received
// would look deleted, and its data removed.
func (b *Binder) Sync(now time.Time) bool {
	b.loaded.Do(b.load)
	v := b.Views.View()
	if !v.Synced {
		return false
	}
	b.mu.Lock()
	held := slices.Clone(b.held)
	b.mu.Unlock()
	var own []reconcile.Replica
	if v.Own != nil {
		own = v.Own.Replicas
	}
	mounts := slices.ContainsFunc(own, func(r reconcile.Replica) bool {
		return slices.ContainsFunc(r.Spec.Volumes, func(vol reconcile.Volume) bool { return vol.Claim != "" })
	})
	if len(held) == 0 && len(v.ClaimRecords) == 0 && !mounts {
		return false // no claim anywhere, none to make: nothing to decide
	}
	p := PlanClaims(ClaimInputs{Self: b.Self, Claims: v.VolumeClaims, Records: v.ClaimRecords, Workloads: v.Workloads, Own: own,
		Use: ClaimsInUse(b.Self, v, own), Held: held, Now: now, Stamp: b.Clock.Now})
	if len(p.Write) > 0 && b.Objects != nil {
		if _, err := b.Objects.Apply(p.Write); err != nil {
			b.Log.Warn("write the claims of a StatefulSet's volumeClaimTemplates", "err", err)
		}
	}
	for _, key := range p.Delete {
		ns, name, _ := strings.Cut(key, "/")
		if b.Objects == nil {
			break
		}
		if _, err := b.Objects.Delete(manifest.KindPersistentVolumeClaim, ns, name); err != nil {
			b.Log.Warn("delete a claim no replica mounts any more (its delete was asked, or its StatefulSet's retention policy says so)", "claim", key, "err", err)
		} else {
			b.Log.Info("deleted a claim no replica mounts any more (its delete was asked, or its StatefulSet's retention policy says so)", "claim", key)
		}
	}
	for _, uid := range p.Remove {
		if !ValidUID(uid) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(b.Dir, filepath.Base(uid))); err != nil {
			b.Log.Warn("remove the volume of a claim given up", "uid", uid, "err", err)
		}
	}
	capacity := map[string]int64{}
	for _, h := range held {
		capacity[h.Binding.UID] = h.Binding.Capacity
	}
	next := p.Next[:0:0]
	for _, h := range p.Next {
		if was, ok := capacity[h.Binding.UID]; ok && was != h.Binding.Capacity && h.Binding.Ready && !slices.Contains(p.Make, h.Binding.UID) {
			// A larger request: the limit follows.
			if err := b.make(&h.Binding); err != nil {
				b.Log.Warn("hold the volume of a claim to its new size", "claim", h.Binding.Namespace+"/"+h.Binding.Claim, "err", err)
			}
		}
		if slices.Contains(p.Make, h.Binding.UID) {
			if err := b.make(&h.Binding); err != nil {
				b.Log.Warn("make the volume of a claim", "claim", h.Binding.Namespace+"/"+h.Binding.Claim, "err", err)
				h.Binding.Ready = false // tried again next time
			} else {
				b.Log.Info("made the volume of a claim bound to this node", "claim", h.Binding.Namespace+"/"+h.Binding.Claim, "dir", ClaimDir(b.Dir, h.Binding.UID))
			}
		}
		next = append(next, h)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	changed := !slices.EqualFunc(b.held, next, func(x, y Held) bool { return x.Binding == y.Binding })
	b.held = next
	return changed
}

// make makes the volume of binding vb: its directory, writable by any
// user as the local-path provisioner makes it (fsGroup, when a pod
// sets one, is applied at the mount), held to its capacity where the
// filesystem can (makeVolume: vb.Enforced), and its binding beside it.
func (b *Binder) make(vb *view.VolumeBinding) error {
	dir := ClaimDir(b.Dir, filepath.Base(vb.UID))
	enforced, why, err := makeVolume(dir, vb.UID, vb.Capacity)
	if err != nil {
		return err
	}
	if !enforced {
		b.Log.Info("the claim's size is advisory on this node", "claim", vb.Namespace+"/"+vb.Claim, "why", why)
	}
	vb.Enforced = enforced
	js, err := json.Marshal(vb)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(dir), ".binding.json.tmp")
	if err := os.WriteFile(tmp, js, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(filepath.Dir(dir), "binding.json"))
}

// load reads back the volumes made before this run (their binding.json).
func (b *Binder) load() {
	entries, err := os.ReadDir(b.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		b.Log.Warn("read the volumes of claims", "dir", b.Dir, "err", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range entries {
		js, err := os.ReadFile(filepath.Join(b.Dir, e.Name(), "binding.json"))
		var vb view.VolumeBinding
		if err != nil || json.Unmarshal(js, &vb) != nil || vb.UID != e.Name() || !ValidUID(vb.UID) {
			continue
		}
		vb.Ready = true
		b.held = append(b.held, Held{Binding: vb})
	}
}

// measure records what each made volume holds; it reports whether a
// figure changed. The walk runs without the lock: the node's record
// (Bindings) is not held back by a large volume's.
func (b *Binder) measure() bool {
	b.mu.Lock()
	var uids []string
	for _, h := range b.held {
		if h.Binding.Ready {
			uids = append(uids, h.Binding.UID)
		}
	}
	b.mu.Unlock()
	used := map[string]int64{}
	for _, uid := range uids {
		used[uid] = Usage(ClaimDir(b.Dir, filepath.Base(uid)))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	changed := false
	for i := range b.held {
		if n, ok := used[b.held[i].Binding.UID]; ok && b.held[i].Binding.Used != n {
			b.held[i].Binding.Used, changed = n, true
		}
	}
	return changed
}
