package view

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/placement"
)

// VolumeBinding is a node's word, in its own record, that it holds the
// data of a PersistentVolumeClaim: a directory under its data directory
// named by the claim's UID. The earliest binding (Since, then the node's
// name) of a claim wins (BindClaims); the others give it up.
type VolumeBinding struct {
	Namespace string `json:"namespace"`
	Claim     string `json:"claim"`
	// UID is the claim object's: a claim deleted and made again under
	// its name is another volume.
	UID string `json:"uid"`
	// Since is when the node bound the claim, on its clock.
	Since hlc.Timestamp `json:"since"`
	// Ready: the directory is made and replicas may mount it. A binding
	// is published before (it pins the claim's replicas to the node at
	// once) and made ready once it has stood for the settle time.
	Ready bool `json:"ready,omitempty"`
	// Capacity is the storage requested, Used what the directory holds
	// (bytes, as last measured); Enforced: a project quota holds the
	// directory to Capacity (else the request is advisory).
	Capacity int64 `json:"capacity"`
	Used     int64 `json:"used"`
	Enforced bool  `json:"enforced,omitempty"`
}

// Released is the value of manifest.ReleasedAnnotation that gives up
// binding b's data ("NODE@WALL.LOGICAL": the node for people, the
// binding's time for the view).
func (b VolumeBinding) Released(node string) string {
	return node + "@" + strconv.FormatInt(b.Since.Wall, 10) + "." + strconv.FormatUint(uint64(b.Since.Logical), 10)
}

// ReleaseMark is the time of the binding claim obj's data was last given
// up from (manifest.ReleasedAnnotation; ok false when never).
func ReleaseMark(obj manifest.Object) (hlc.Timestamp, bool) {
	v, ok := obj.Claim.Annotations[manifest.ReleasedAnnotation]
	_, at, cut := strings.Cut(v, "@")
	wall, logical, dot := strings.Cut(at, ".")
	w, err1 := strconv.ParseInt(wall, 10, 64)
	l, err2 := strconv.ParseUint(logical, 10, 32)
	if !ok || !cut || !dot || err1 != nil || err2 != nil {
		return hlc.Timestamp{}, false
	}
	return hlc.Timestamp{Wall: w, Logical: uint32(l)}, true
}

// Released reports whether binding b of claim obj was given up: it is no
// later than the binding last released (ReleaseMark). A second release
// then gives up the first's binding too: its node's older data never
// comes back as the claim's.
func Released(obj manifest.Object, b VolumeBinding) bool {
	mark, ok := ReleaseMark(obj)
	return ok && b.Since.Compare(mark) <= 0
}

// VolumeClaim is a PersistentVolumeClaim as the view holds it, with where its
// data lives.
type VolumeClaim struct {
	Object manifest.Object
	// Node holds the claim's data ("": not bound yet), as Binding says.
	Node    string
	Binding VolumeBinding
}

// Key is the claim's "namespace/name".
func (c VolumeClaim) Key() string { return c.Object.Namespace + "/" + c.Object.Name }

// BindClaims returns the claims of objs (of the kind PersistentVolumeClaim) by
// "namespace/name", each with the node that holds its data: of the
// bindings the nodes' records (statuses) hold for the claim's UID, and
// that its ReleasedAnnotation does not give up, the earliest by Since,
// then by node name. O(claims + bindings).
func BindClaims(objs []manifest.Object, statuses map[string]NodeStatus) map[string]VolumeClaim {
	if len(objs) == 0 {
		return nil
	}
	out := make(map[string]VolumeClaim, len(objs))
	for _, o := range objs {
		if o.Claim != nil {
			c := VolumeClaim{Object: o}
			out[c.Key()] = c
		}
	}
	for node, s := range statuses {
		for _, b := range s.Volumes {
			c, ok := out[b.Namespace+"/"+b.Claim]
			if !ok || string(c.Object.Claim.UID) != b.UID || Released(c.Object, b) {
				continue
			}
			if c.Node == "" || cmp.Or(b.Since.Compare(c.Binding.Since), strings.Compare(node, c.Node)) < 0 {
				c.Node, c.Binding = node, b
				out[c.Key()] = c
			}
		}
	}
	return out
}

// pinsOf returns, by workload key and ordinal, the node a replica must
// run on: the node that holds the data of a claim it mounts (the first
// bound one in volume order; a StatefulSet ordinal's own claims from its
// volumeClaimTemplates after the claims all its pods mount).
func pinsOf(workloads []manifest.Object, claims map[string]VolumeClaim) map[string]map[int]string {
	if len(claims) == 0 {
		return nil
	}
	var out map[string]map[int]string
	pin := func(o manifest.Object, ord int, node string) {
		key := reconcile.WorkloadKey(o.Namespace, o.Name)
		if out == nil {
			out = map[string]map[int]string{}
		}
		if out[key] == nil {
			out[key] = map[int]string{}
		}
		if _, ok := out[key][ord]; !ok {
			out[key][ord] = node
		}
	}
	for _, o := range workloads {
		if !o.IsWorkload() {
			continue
		}
		for _, name := range manifest.ClaimsOf(&o.PodTemplate().Spec) {
			if c := claims[o.Namespace+"/"+name]; c.Node != "" {
				for ord := range o.Replicas() {
					pin(o, ord, c.Node)
				}
				break
			}
		}
		if o.StatefulSet == nil {
			continue
		}
		for ord := range o.Replicas() {
			for _, t := range o.StatefulSet.Spec.VolumeClaimTemplates {
				if c := claims[o.Namespace+"/"+reconcile.TemplateClaimName(t.Name, o.Name, ord)]; c.Node != "" {
					pin(o, ord, c.Node)
					break
				}
			}
		}
	}
	return out
}

// pinned returns ws with the replicas in pins pinned to their node
// (placement.Workload.Pinned).
func pinned(ws []placement.Workload, pins map[string]map[int]string) []placement.Workload {
	for i, w := range ws {
		ws[i].Pinned = pins[w.Key]
	}
	return ws
}

// pinsKey identifies pins, placement's input.
func pinsKey(pins map[string]map[int]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(pins)) {
		b.WriteString(k + "=")
		for _, ord := range slices.Sorted(maps.Keys(pins[k])) {
			b.WriteString(strconv.Itoa(ord) + ":" + pins[k][ord] + ",")
		}
		b.WriteByte(';')
	}
	return b.String()
}

// ClaimsOn resolves, for node self, the claims its replicas mount
// (reconcile.Decision's Claims): the UID of the claim's volume when
// self holds it ready, else a *reconcile.ClaimWait saying what the
// replica waits for.
func (v *View) ClaimsOn(self string) func(namespace, name string) (string, error) {
	return func(namespace, name string) (string, error) {
		c, ok := v.VolumeClaims[namespace+"/"+name]
		switch {
		case !ok:
			return "", &reconcile.ClaimWait{Msg: fmt.Sprintf("persistentvolumeclaim %q not found", name)}
		case c.Node == "":
			return "", &reconcile.ClaimWait{Msg: fmt.Sprintf("waiting for persistentvolumeclaim %q to be bound to a node", name)}
		case c.Node != self:
			return "", &reconcile.ClaimWait{Msg: fmt.Sprintf("the volume of persistentvolumeclaim %q is on node %s", name, c.Node)}
		case c.Object.Claim.Annotations[manifest.DeletionRequestedAnnotation] != "":
			return "", &reconcile.ClaimWait{Msg: fmt.Sprintf("persistentvolumeclaim %q is being deleted", name)}
		case !c.Binding.Ready:
			return "", &reconcile.ClaimWait{Msg: fmt.Sprintf("waiting for the volume of persistentvolumeclaim %q to be made on this node", name)}
		}
		return c.Binding.UID, nil
	}
}

// OncePodClaims are the ReadWriteOncePod claims, by "namespace/name"
// (reconcile.Decision's OncePod; nil when there is none).
func (v *View) OncePodClaims() map[string]bool {
	var out map[string]bool
	for key, c := range v.VolumeClaims {
		if c.Object.Claim != nil && slices.Contains(c.Object.Claim.Spec.AccessModes, corev1.ReadWriteOncePod) {
			if out == nil {
				out = map[string]bool{}
			}
			out[key] = true
		}
	}
	return out
}

// DecorateClaims sets, in each item (a PersistentVolumeClaim as stored),
// its status as the view knows it: phase Bound once its volume is made
// on a node (Pending before), capacity and access modes, spec.volumeName
// "pvc-UID", and the annotations of manifest.SelectedNodeAnnotation and after. Items that do not decode are
// left as they are.
func DecorateClaims(items []api.Object, claims map[string]VolumeClaim) {
	for i, it := range items {
		o, err := manifest.Decode(it.Object)
		if err != nil || o.Claim == nil {
			continue
		}
		c := o.Claim
		c.Status.Phase = corev1.ClaimPending
		if t, err := time.Parse(time.RFC3339, c.Annotations[manifest.DeletionRequestedAnnotation]); err == nil {
			c.DeletionTimestamp = &metav1.Time{Time: t}
			c.Finalizers = []string{"kubernetes.io/pvc-protection"}
		}
		if vc, ok := claims[o.Namespace+"/"+o.Name]; ok && vc.Node != "" {
			if c.Annotations == nil {
				c.Annotations = map[string]string{}
			}
			c.Annotations[manifest.SelectedNodeAnnotation] = vc.Node
			c.Annotations[manifest.VolumeDirAnnotation] = "volumes/" + vc.Binding.UID + "/data"
			c.Annotations[manifest.UsedAnnotation] = strconv.FormatInt(vc.Binding.Used, 10)
			c.Annotations[manifest.SizeLimitAnnotation] = "advisory"
			if vc.Binding.Enforced {
				c.Annotations[manifest.SizeLimitAnnotation] = "enforced"
			}
			if vc.Binding.Ready {
				c.Status.Phase = corev1.ClaimBound
				c.Spec.VolumeName = "pvc-" + vc.Binding.UID
				c.Status.AccessModes = c.Spec.AccessModes
				c.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(vc.Binding.Capacity, resource.BinarySI)}
			}
		}
		if b, err := manifest.Encode(o); err == nil {
			items[i].Object = b
		}
	}
}

// ClaimUsers are the desired replicas of v that mount claim
// namespace/name, by name.
func ClaimUsers(v *View, namespace, name string) []string {
	var out []string
	for _, d := range v.All {
		r := d.Replica()
		if r.Namespace != namespace {
			continue
		}
		for _, vol := range r.Spec.Volumes {
			if vol.ClaimName(r) == name {
				out = append(out, r.Name)
				break
			}
		}
	}
	return out
}

// DeleteClaim is what a delete of claim obj stores while users mount it:
// obj with DeletionRequestedAnnotation at now (ok false when none mounts
// it: it is deleted at once).
func DeleteClaim(obj manifest.Object, users []string, now time.Time) (manifest.Object, bool) {
	if len(users) == 0 || obj.Claim == nil {
		return obj, false
	}
	c := obj.Claim.DeepCopy()
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	if c.Annotations[manifest.DeletionRequestedAnnotation] == "" {
		c.Annotations[manifest.DeletionRequestedAnnotation] = now.UTC().Format(time.RFC3339)
	}
	obj.Claim = c
	return obj, true
}

// ReleaseClaim returns claim obj with its data given up from the node
// that holds it (manifest.ReleasedAnnotation), and that node: the next
// replica that mounts it starts empty elsewhere. It refuses a claim not
// bound, and one whose node is alive, or a member up though not counted
// yet (back and settling): its data is there (delete the claim to delete
// the data). A node on the minority side of a partition sees the others
// dead: release from a node that sees most of the cluster.
func ReleaseClaim(obj manifest.Object, v *View) (manifest.Object, string, error) {
	vc, ok := v.VolumeClaims[obj.Namespace+"/"+obj.Name]
	switch {
	case obj.Claim == nil:
		return obj, "", fmt.Errorf("%s is not a PersistentVolumeClaim", obj.Key())
	case !ok || vc.Node == "":
		return obj, "", fmt.Errorf("persistentvolumeclaim %s/%s is bound to no node: there is no data to release", obj.Namespace, obj.Name)
	}
	if st, member := MemberState(v.Members, vc.Node); v.Alive[vc.Node] || member && st.Up() {
		return obj, "", fmt.Errorf("persistentvolumeclaim %s/%s: node %s is up and holds its data; release gives up the data of a node that is gone (delete the claim to delete its data)",
			obj.Namespace, obj.Name, vc.Node)
	}
	c := obj.Claim.DeepCopy()
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[manifest.ReleasedAnnotation] = vc.Binding.Released(vc.Node)
	obj.Claim = c
	return obj, vc.Node, nil
}
