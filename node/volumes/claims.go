package volumes

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/gossip/hlc"
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
// on, the volumes (by claim UID) to make, and those to remove.
type ClaimPlan struct {
	Next         []Held
	Make, Remove []string
}

// PlanClaims decides this node's bindings of PersistentVolumeClaims from
// the claims as the view binds them (view.BindClaims), the replicas this
// node owns, the claims its replicas mount (inUse, by
// "namespace/claim"), its bindings held, and now; stamp gives a new
// binding's time. A pure function:
//   - a claim that a replica this node owns mounts, and that no node
//     holds, is bound here (published, not made yet);
//   - a binding that has stood ClaimSettle and still wins in v
//     (view.BindClaims) is made (its directory) and Ready;
//   - a binding that another node's earlier one beats is given up: its
//     volume is removed when it was not made yet, and kept on disk, with
//     what a replica may have written, when it was;
//   - a binding of a claim deleted, made again (another UID) or released
//     (manifest.ReleasedAnnotation) is given up and its volume removed
//     once no replica of this node mounts the claim (Kubernetes' reclaim
//     policy Delete, as the local-path provisioner has it).
func PlanClaims(self string, claims map[string]view.VolumeClaim, own []reconcile.Replica, inUse map[string]bool, held []Held, now time.Time,
	stamp func() hlc.Timestamp) ClaimPlan {
	var p ClaimPlan
	mine := map[string]bool{} // by "namespace/claim"
	for _, h := range held {
		b := h.Binding
		key := b.Namespace + "/" + b.Claim
		c, ok := claims[key]
		gone := !ok || string(c.Object.Claim.UID) != b.UID || c.Object.Claim.Annotations[manifest.ReleasedAnnotation] == b.Released(self)
		switch {
		case gone && inUse[key]:
			p.Next = append(p.Next, h) // given up once no replica here mounts it
			mine[key] = true
			continue
		case gone:
			p.Remove = append(p.Remove, b.UID)
			continue
		case c.Node != "" && c.Node != self:
			if !b.Ready {
				p.Remove = append(p.Remove, b.UID)
			}
			continue
		}
		mine[key] = true
		b.Capacity = storageOf(c.Object.Claim)
		if !b.Ready && c.Node == self && now.Sub(h.At) >= ClaimSettle {
			b.Ready = true
			p.Make = append(p.Make, b.UID)
		}
		p.Next = append(p.Next, Held{Binding: b, At: h.At})
	}
	for _, r := range own {
		for _, vol := range r.Spec.Volumes {
			key := r.Namespace + "/" + vol.Claim
			c, ok := claims[key]
			if vol.Claim == "" || !ok || c.Node != "" || mine[key] || !ValidUID(string(c.Object.Claim.UID)) {
				continue
			}
			mine[key] = true
			p.Next = append(p.Next, Held{At: now, Binding: view.VolumeBinding{Namespace: r.Namespace, Claim: vol.Claim,
				UID: string(c.Object.Claim.UID), Since: stamp(), Capacity: storageOf(c.Object.Claim)}})
		}
	}
	return p
}

// ValidUID reports whether uid is a claim UID a volume may be named by:
// a UUID in its 36-character form, as the API gives (a record from a peer
// is untrusted: its UID names a directory).
func ValidUID(uid string) bool {
	_, err := uuid.Parse(uid)
	return err == nil && len(uid) == 36
}

// claimsInUse are the claims ("namespace/claim") that the replicas this
// node owns or lists in its record mount.
func claimsInUse(self string, v *view.View) map[string]bool {
	running := map[string]bool{} // workload keys
	for _, r := range v.Statuses[self].Replicas {
		running[r.Namespace+"/"+r.Workload] = true
	}
	if v.Own != nil {
		for _, r := range v.Own.Replicas {
			running[r.Namespace+"/"+r.Workload] = true
		}
	}
	out := map[string]bool{}
	for _, o := range v.Workloads {
		if o.IsWorkload() && running[o.Namespace+"/"+o.Name] {
			for _, c := range manifest.ClaimsOf(&o.PodTemplate().Spec) {
				out[o.Namespace+"/"+c] = true
			}
		}
	}
	return out
}

func storageOf(c *corev1.PersistentVolumeClaim) int64 {
	q := c.Spec.Resources.Requests[corev1.ResourceStorage]
	return q.Value()
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
	// Stamp gives a new binding's time (the node's hybrid clock);
	// Publish has the node's record published again.
	Stamp   func() hlc.Timestamp
	Publish func()
	Log     *slog.Logger

	mu   sync.Mutex
	held []Held
}

// Bindings are the bindings this node's record lists (none from a nil
// Binder).
func (b *Binder) Bindings() []view.VolumeBinding {
	if b == nil {
		return nil
	}
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

// Run binds, makes and removes volumes on each new view and every
// second (ClaimSettle), until ctx ends.
func (b *Binder) Run(ctx context.Context) {
	b.load()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var measured time.Time
	for {
		changed := b.Sync(time.Now())
		if time.Since(measured) >= usageEvery {
			changed = b.measure() || changed
			measured = time.Now()
		}
		if changed && b.Publish != nil {
			b.Publish()
		}
		select {
		case <-ctx.Done():
			return
		case <-b.Views.Changed():
		case <-tick.C:
		}
	}
}

// Sync applies one PlanClaims at now; it reports whether the bindings
// changed.
func (b *Binder) Sync(now time.Time) bool {
	b.mu.Lock()
	held := slices.Clone(b.held)
	b.mu.Unlock()
	v := b.Views.View()
	var own []reconcile.Replica
	if v.Own != nil {
		own = v.Own.Replicas
	}
	p := PlanClaims(b.Self, v.VolumeClaims, own, claimsInUse(b.Self, v), held, now, b.Stamp)
	for _, uid := range p.Remove {
		if !ValidUID(uid) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(b.Dir, filepath.Base(uid))); err != nil {
			b.Log.Warn("remove the volume of a claim given up", "uid", uid, "err", err)
		}
	}
	next := p.Next[:0:0]
	for _, h := range p.Next {
		if slices.Contains(p.Make, h.Binding.UID) {
			if err := b.make(h.Binding); err != nil {
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
// sets one, is applied at the mount), and its binding beside it.
func (b *Binder) make(vb view.VolumeBinding) error {
	dir := ClaimDir(b.Dir, filepath.Base(vb.UID))
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
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
// figure changed.
func (b *Binder) measure() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	changed := false
	for i := range b.held {
		if vb := &b.held[i].Binding; vb.Ready {
			used := Usage(ClaimDir(b.Dir, vb.UID))
			changed = changed || used != vb.Used
			vb.Used = used
		}
	}
	return changed
}
