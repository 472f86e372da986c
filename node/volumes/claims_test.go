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
	unbound := map[string]view.VolumeClaim{"ns/data": {Object: claimObj(nil)}}

	p := PlanClaims("n1", unbound, own, nil, nil, t0, stamp)
	if len(p.Next) != 1 || p.Next[0].Binding.Ready || p.Next[0].Binding.UID != uid || p.Next[0].Binding.Capacity != 1<<30 || len(p.Make) != 0 {
		t.Fatalf("first pass: %+v", p)
	}
	held := p.Next
	bound := func(node string, b view.VolumeBinding) map[string]view.VolumeClaim {
		return map[string]view.VolumeClaim{"ns/data": {Object: claimObj(nil), Node: node, Binding: b}}
	}
	mine := bound("n1", held[0].Binding)
	if p := PlanClaims("n1", mine, own, nil, held, t0.Add(ClaimSettle/2), stamp); len(p.Make) != 0 || p.Next[0].Binding.Ready {
		t.Fatalf("made before the binding stood: %+v", p)
	}
	p = PlanClaims("n1", mine, own, nil, held, t0.Add(ClaimSettle), stamp)
	if len(p.Make) != 1 || !p.Next[0].Binding.Ready {
		t.Fatalf("not made once it stood: %+v", p)
	}
	// Beaten by n2's earlier binding: given up; removed while unmade.
	theirs := bound("n2", view.VolumeBinding{Namespace: "ns", Claim: "data", UID: uid, Since: hlc.Timestamp{Wall: 1}})
	if p := PlanClaims("n1", theirs, own, nil, held, t0.Add(ClaimSettle), stamp); len(p.Next) != 0 || len(p.Remove) != 1 {
		t.Fatalf("beaten while unmade: %+v", p)
	}
	made := []Held{{Binding: view.VolumeBinding{Namespace: "ns", Claim: "data", UID: uid, Ready: true}}}
	if p := PlanClaims("n1", theirs, own, nil, made, t0, stamp); len(p.Next) != 0 || len(p.Remove) != 0 {
		t.Fatalf("beaten once made (data kept on disk): %+v", p)
	}
	// Deleted: kept while a replica here mounts it, removed after.
	inUse := map[string]bool{"ns/data": true}
	if p := PlanClaims("n1", nil, nil, inUse, made, t0, stamp); len(p.Next) != 1 || len(p.Remove) != 0 {
		t.Fatalf("deleted while in use: %+v", p)
	}
	if p := PlanClaims("n1", nil, nil, nil, made, t0, stamp); len(p.Next) != 0 || len(p.Remove) != 1 {
		t.Fatalf("deleted, unused: %+v", p)
	}
	// Released from this node: removed once unused; not bound again
	// while the claim is bound elsewhere.
	rel := map[string]view.VolumeClaim{"ns/data": {Object: claimObj(map[string]string{manifest.ReleasedAnnotation: made[0].Binding.Released("n1")}),
		Node: "n2", Binding: view.VolumeBinding{UID: uid}}}
	if p := PlanClaims("n1", rel, own, nil, made, t0, stamp); len(p.Next) != 0 || len(p.Remove) != 1 {
		t.Fatalf("released: %+v", p)
	}
	// A claim whose UID is no UUID (a peer's record) names no directory.
	bad := claimObj(nil)
	bad.Claim.UID = "../../etc"
	if p := PlanClaims("n1", map[string]view.VolumeClaim{"ns/data": {Object: bad}}, own, nil, nil, t0, stamp); len(p.Next) != 0 {
		t.Fatalf("bound a claim whose UID is a path: %+v", p)
	}
}
