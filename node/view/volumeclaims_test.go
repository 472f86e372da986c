package view

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

const uid1 = "8f3e7c1a-1b2c-4d5e-8f90-123456789abc"

// TestAClaimIsBoundWhereItsEarliestBindingIs: of two nodes that bound a
// claim at once, the earliest binding wins on every node; a binding of
// an earlier claim of the name (another UID) or one released counts for
// nothing; a bound claim pins every replica of the workloads that mount
// it to its node, and resolves to its volume only there, once made.
func TestAClaimIsBoundWhereItsEarliestBindingIs(t *testing.T) {
	claim := mustParse(t, "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data, namespace: ns}\nspec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n")
	claim.Claim.UID = types.UID(uid1)
	dep := mustParse(t, `apiVersion: apps/v1
kind: Deployment
metadata: {name: db, namespace: ns}
spec:
  strategy: {type: Recreate}
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: db, image: db}]
      volumes: [{name: d, persistentVolumeClaim: {claimName: data}}]
`)
	bind := func(wall int64, ready bool) VolumeBinding {
		return VolumeBinding{Namespace: "ns", Claim: "data", UID: uid1, Since: hlc.Timestamp{Wall: wall}, Ready: ready, Capacity: 1 << 30}
	}
	statuses := map[string]NodeStatus{
		"n1": {Name: "n1", Volumes: []VolumeBinding{bind(20, false)}},
		"n2": {Name: "n2", Volumes: []VolumeBinding{bind(10, true)}},
		"n3": {Name: "n3", Volumes: []VolumeBinding{{Namespace: "ns", Claim: "data", UID: "00000000-0000-0000-0000-000000000000", Since: hlc.Timestamp{Wall: 1}}}},
	}
	claims := BindClaims([]manifest.Object{claim}, statuses)
	if c := claims["ns/data"]; c.Node != "n2" || !c.Binding.Ready {
		t.Fatalf("bound to %q (%+v), want n2, the earliest of its UID", c.Node, c.Binding)
	}
	pins := pinsOf([]manifest.Object{dep}, claims)
	if pins["ns/db"][0] != "n2" {
		t.Fatalf("pins %v, want ns/db on n2", pins)
	}
	v := &View{VolumeClaims: claims, Alive: map[string]bool{"n1": true}}
	if id, err := v.ClaimsOn("n2")("ns", "data"); err != nil || id != uid1 {
		t.Fatalf("on n2: %q %v", id, err)
	}
	if _, err := v.ClaimsOn("n1")("ns", "data"); err == nil || !strings.Contains(err.Error(), "node n2") {
		t.Fatalf("on n1: %v, want one naming n2", err)
	}
	if _, err := v.ClaimsOn("n2")("ns", "other"); err == nil || !strings.Contains(err.Error(), `"other" not found`) {
		t.Fatalf("a missing claim: %v", err)
	}

	// Served with its status.
	js, _ := manifest.Encode(claim)
	items := []api.Object{{Object: js}}
	DecorateClaims(items, claims)
	for _, want := range []string{`"phase":"Bound"`, `"volume.kubernetes.io/selected-node":"n2"`, `"storage":"1Gi"`, `"volumeName":"pvc-` + uid1} {
		if !strings.Contains(string(items[0].Object), want) {
			t.Errorf("served claim lacks %s: %s", want, items[0].Object)
		}
	}

	// Released (n2 is gone): the binding counts for nothing, and n1's
	// takes over; released again while n1 is up: refused.
	released, node, err := ReleaseClaim(claim, v)
	if err != nil || node != "n2" {
		t.Fatalf("release: %v %q", err, node)
	}
	claims = BindClaims([]manifest.Object{released}, statuses)
	if c := claims["ns/data"]; c.Node != "n1" {
		t.Fatalf("after the release bound to %q, want n1", c.Node)
	}
	if _, _, err := ReleaseClaim(released, &View{VolumeClaims: claims, Alive: map[string]bool{"n1": true}}); err == nil || !strings.Contains(err.Error(), "node n1 is up") {
		t.Fatalf("release of a live node's claim: %v", err)
	}
}

// TestResourceEnvIsTheKubeletsValue: requests and limits divided by the
// divisor, rounded up; an unset request is the limit, or 0; an unset
// limit is left to the node (its allocatable).
func TestResourceEnvIsTheKubeletsValue(t *testing.T) {
	res := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("100Mi")}}
	for _, tc := range []struct {
		resource, divisor, want, left string
	}{
		{"limits.cpu", "", "2", ""},
		{"limits.cpu", "1m", "1500", ""},
		{"requests.cpu", "1m", "1500", ""},
		{"limits.memory", "1Mi", "100", ""},
		{"limits.memory", "", "104857600", ""},
	} {
		r := &corev1.ResourceFieldSelector{Resource: tc.resource}
		if tc.divisor != "" {
			r.Divisor = resource.MustParse(tc.divisor)
		}
		if v := resourceEnv(reconcile.EnvVar{Name: "V"}, r, res); v.Value != tc.want || !v.Literal {
			t.Errorf("%s / %s: %+v, want %s", tc.resource, tc.divisor, v, tc.want)
		}
	}
	if v := resourceEnv(reconcile.EnvVar{Name: "V"}, &corev1.ResourceFieldSelector{Resource: "requests.memory"}, corev1.ResourceRequirements{}); v.Value != "0" {
		t.Errorf("unset request and limit: %+v", v)
	}
	if v := resourceEnv(reconcile.EnvVar{Name: "V"}, &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}, corev1.ResourceRequirements{}); v.Resource != "limits.memory" || v.DivisorMilli != 1<<20*1000 || v.Literal {
		t.Errorf("unset limit: %+v", v)
	}
}
