package volumes

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

const uid = "8f3e7c1a-1b2c-4d5e-8f90-123456789abc"

func claimObj(annotations map[string]string) manifest.Object {
	return manifest.Object{Kind: manifest.KindPersistentVolumeClaim, Namespace: "ns", Name: "data", Claim: &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "ns", UID: uid, Annotations: annotations},
		Spec: corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}}
}

// TestABindingIsPublishedThenMadeOnceItStands: a node that owns a
// replica mounting an unbound claim binds it (not made yet), makes it
// once the binding has stood ClaimSettle and still wins, gives up a
// binding another node's earlier one beats (removing it only when it
// made nothing), and removes the volume of a claim deleted or released
// once no replica of the node mounts it.
func TestABindingIsPublishedThenMadeOnceItStands(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	stamp := func() hlc.Timestamp { return hlc.Timestamp{Wall: 42} }
	own := []reconcile.Replica{{Namespace: "ns", Workload: "db", Spec: reconcile.Spec{Volumes: []reconcile.Volume{{Name: "d", Claim: "data"}}}}}
	plan := func(claims map[string]view.VolumeClaim, own []reconcile.Replica, inUse map[string]bool, held []Held, now time.Time) ClaimPlan {
		records := map[string]bool{}
		for k := range claims {
			records[k] = true
		}
		return PlanClaims(ClaimInputs{Self: "n1", Claims: claims, Records: records, Own: own, Use: ClaimUse{All: inUse, Stopping: inUse}, Held: held, Now: now, Stamp: stamp})
	}
	unbound := map[string]view.VolumeClaim{"ns/data": {Object: claimObj(nil)}}

	p := plan(unbound, own, nil, nil, t0)
	if len(p.Next) != 1 || p.Next[0].Binding.Ready || p.Next[0].Binding.UID != uid || p.Next[0].Binding.Capacity != 1<<30 || len(p.Make) != 0 {
		t.Fatalf("first pass: %+v", p)
	}
	held := p.Next
	bound := func(node string, b view.VolumeBinding) map[string]view.VolumeClaim {
		return map[string]view.VolumeClaim{"ns/data": {Object: claimObj(nil), Node: node, Binding: b}}
	}
	mine := bound("n1", held[0].Binding)
	if p := plan(mine, own, nil, held, t0.Add(ClaimSettle/2)); len(p.Make) != 0 || p.Next[0].Binding.Ready {
		t.Fatalf("made before the binding stood: %+v", p)
	}
	p = plan(mine, own, nil, held, t0.Add(ClaimSettle))
	if len(p.Make) != 1 || !p.Next[0].Binding.Ready {
		t.Fatalf("not made once it stood: %+v", p)
	}
	// Beaten by n2's earlier binding: given up; removed while unmade.
	theirs := bound("n2", view.VolumeBinding{Namespace: "ns", Claim: "data", UID: uid, Since: hlc.Timestamp{Wall: 1}})
	if p := plan(theirs, own, nil, held, t0.Add(ClaimSettle)); len(p.Next) != 0 || len(p.Remove) != 1 {
		t.Fatalf("beaten while unmade: %+v", p)
	}
	made := []Held{{Binding: view.VolumeBinding{Namespace: "ns", Claim: "data", UID: uid, Ready: true}}}
	if p := plan(theirs, own, nil, made, t0); len(p.Next) != 0 || len(p.Remove) != 0 {
		t.Fatalf("beaten once made (data kept on disk): %+v", p)
	}
	// Deleted: kept while a replica here mounts it, removed after.
	inUse := map[string]bool{"ns/data": true}
	if p := plan(nil, nil, inUse, made, t0); len(p.Next) != 1 || len(p.Remove) != 0 {
		t.Fatalf("deleted while in use: %+v", p)
	}
	if p := plan(nil, nil, nil, made, t0); len(p.Next) != 0 || len(p.Remove) != 1 {
		t.Fatalf("deleted, unused: %+v", p)
	}
	// Released from this node: removed once unused; not bound again
	// while the claim is bound elsewhere.
	rel := map[string]view.VolumeClaim{"ns/data": {Object: claimObj(map[string]string{manifest.ReleasedAnnotation: made[0].Binding.Released("n1")}),
		Node: "n2", Binding: view.VolumeBinding{UID: uid}}}
	if p := plan(rel, own, nil, made, t0); len(p.Next) != 0 || len(p.Remove) != 1 {
		t.Fatalf("released: %+v", p)
	}
	// A claim whose UID is no UUID (a peer's record) names no directory.
	bad := claimObj(nil)
	bad.Claim.UID = "../../etc"
	if p := plan(map[string]view.VolumeClaim{"ns/data": {Object: bad}}, own, nil, nil, t0); len(p.Next) != 0 {
		t.Fatalf("bound a claim whose UID is a path: %+v", p)
	}
}

// TestAStatefulSetOrdinalGetsItsOwnClaim: the owner of an ordinal whose
// claim does not exist creates it from the volumeClaimTemplate (named
// TEMPLATE-STATEFULSET-ORDINAL, labelled with the selector, annotated
// with its StatefulSet, ordinal and whenDeleted); once bound here, the
// claim is deleted only by the retention policy: the StatefulSet gone
// under whenDeleted Delete, its ordinal scaled away under whenScaled
// Delete, and never while a replica here mounts it.
func TestAStatefulSetOrdinalGetsItsOwnClaim(t *testing.T) {
	objs, err := manifest.Parse([]byte(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: pg, namespace: ns}
spec:
  replicas: 2
  selector: {matchLabels: {app: pg}}
  persistentVolumeClaimRetentionPolicy: {whenDeleted: Delete, whenScaled: Delete}
  template:
    metadata: {labels: {app: pg}}
    spec:
      containers: [{name: pg, image: pg, volumeMounts: [{name: data, mountPath: /data}]}]
  volumeClaimTemplates:
  - metadata: {name: data, labels: {tier: db}}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 2Gi}}}
`), "s.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sts := objs[0]
	r := reconcile.Replica{Namespace: "ns", Workload: "pg", Ordinal: 1, Spec: reconcile.Spec{Volumes: []reconcile.Volume{{Name: "data", Claim: "data", ClaimTemplate: true}}}}
	in := ClaimInputs{Self: "n1", Workloads: []manifest.Object{sts}, Own: []reconcile.Replica{r}, Now: time.Unix(1e9, 0), Stamp: func() hlc.Timestamp { return hlc.Timestamp{} }}
	p := PlanClaims(in)
	if len(p.Write) != 1 || len(p.Next) != 0 {
		t.Fatalf("plan: %+v", p)
	}
	c := p.Write[0].Claim
	if c.Name != "data-pg-1" || c.Labels["app"] != "pg" || c.Labels["tier"] != "db" || c.Annotations[OrdinalAnnotation] != "1" || c.Annotations[WhenDeletedAnnotation] != "Delete" {
		t.Fatalf("claim made: %+v", c.ObjectMeta)
	}
	if errs := manifest.Validate(p.Write[0]); len(errs) != 0 {
		t.Fatalf("the claim made does not validate: %v", errs)
	}
	// Bound here: kept while the StatefulSet wants ordinal 1.
	c.UID = uid
	b := view.VolumeBinding{Namespace: "ns", Claim: "data-pg-1", UID: uid, Ready: true}
	in.Claims = map[string]view.VolumeClaim{"ns/data-pg-1": {Object: p.Write[0], Node: "n1", Binding: b}}
	in.Records = map[string]bool{"ns/data-pg-1": true}
	in.Held, in.Own = []Held{{Binding: b}}, nil
	if p := PlanClaims(in); len(p.Delete) != 0 || len(p.Write) != 0 {
		t.Fatalf("deleted while wanted: %+v", p)
	}
	one := sts
	one.StatefulSet = sts.StatefulSet.DeepCopy()
	*one.StatefulSet.Spec.Replicas = 1
	in.Workloads = []manifest.Object{one}
	in.Use = ClaimUse{All: map[string]bool{"ns/data-pg-1": true}}
	if p := PlanClaims(in); len(p.Delete) != 0 {
		t.Fatalf("deleted while a replica here mounts it: %+v", p)
	}
	in.Use = ClaimUse{}
	if p := PlanClaims(in); len(p.Delete) != 1 || p.Delete[0] != "ns/data-pg-1" {
		t.Fatalf("scaled away under whenScaled Delete: %+v", p)
	}
	in.Workloads = nil
	if p := PlanClaims(in); len(p.Delete) != 1 {
		t.Fatalf("StatefulSet deleted under whenDeleted Delete: %+v", p)
	}
	c.Annotations[WhenDeletedAnnotation] = "Retain"
	if p := PlanClaims(in); len(p.Delete) != 0 {
		t.Fatalf("StatefulSet deleted under whenDeleted Retain: %+v", p)
	}
}

// TestGivenUpBindingsNeitherBlockNorLoseData: a claim made again (a new
// UID) while the old replica still stops here is bound anew at once,
// its old volume kept until the old replica is gone; a claim whose
// record does not decode here is left alone; a volume whose UID another
// claim has is never removed; a binding made after a release is later
// than it whatever the node's clock says.
func TestGivenUpBindingsNeitherBlockNorLoseData(t *testing.T) {
	const newUID = "11111111-2222-4333-8444-555555555555"
	stamp := func() hlc.Timestamp { return hlc.Timestamp{Wall: 5} }
	own := []reconcile.Replica{{Namespace: "ns", Name: "db-new-0", Workload: "db", Spec: reconcile.Spec{Volumes: []reconcile.Volume{{Name: "d", Claim: "data"}}}}}
	remade := claimObj(nil)
	remade.Claim.UID = newUID
	old := []Held{{Binding: view.VolumeBinding{Namespace: "ns", Claim: "data", UID: uid, Ready: true}}}
	in := ClaimInputs{Self: "n1", Claims: map[string]view.VolumeClaim{"ns/data": {Object: remade}}, Records: map[string]bool{"ns/data": true},
		Own: own, Use: ClaimUse{All: map[string]bool{"ns/data": true}, Stopping: map[string]bool{"ns/data": true}}, Held: old, Now: time.Unix(1e9, 0), Stamp: stamp}
	p := PlanClaims(in)
	if len(p.Next) != 2 || p.Next[1].Binding.UID != newUID || len(p.Remove) != 0 {
		t.Fatalf("remade while the old replica stops: %+v", p)
	}
	in.Use.Stopping = nil
	if p := PlanClaims(in); len(p.Remove) != 1 || p.Remove[0] != uid {
		t.Fatalf("the old replica gone: %+v", p)
	}
	// Its record does not decode here.
	in.Claims = nil
	if p := PlanClaims(in); len(p.Remove) != 0 || len(p.Next) != 1 {
		t.Fatalf("undecodable claim: %+v", p)
	}
	// Another claim has the UID (a peer's doing): not removed.
	twin := claimObj(nil)
	twin.Name, twin.Claim.Name = "twin", "twin"
	in.Claims, in.Records = map[string]view.VolumeClaim{"ns/twin": {Object: twin}}, map[string]bool{"ns/twin": true}
	if p := PlanClaims(in); len(p.Remove) != 0 {
		t.Fatalf("removed a volume another claim names: %+v", p)
	}
	// Released at wall 9: a new binding is later, though this clock says 5.
	rel := claimObj(map[string]string{manifest.ReleasedAnnotation: "n2@9.0"})
	in.Claims, in.Records, in.Held = map[string]view.VolumeClaim{"ns/data": {Object: rel}}, map[string]bool{"ns/data": true}, nil
	p = PlanClaims(in)
	if len(p.Next) != 1 || p.Next[0].Binding.Since.Compare(hlc.Timestamp{Wall: 9}) <= 0 || view.Released(rel, p.Next[0].Binding) {
		t.Fatalf("bound after a release: %+v", p)
	}
}
