package manifest

import (
	"strings"
	"testing"
)

const claimYAML = `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
`

// workloadYAML is an apps/v1 workload of kind named name, selecting
// app=name, whose pod spec is podSpec (lines indented by six spaces).
func workloadYAML(kind, name, podSpec string) string {
	return "apiVersion: apps/v1\nkind: " + kind + "\nmetadata: {name: " + name + "}\nspec:\n  selector: {matchLabels: {app: " + name + "}}\n" +
		"  template:\n    metadata: {labels: {app: " + name + "}}\n    spec:\n" + podSpec
}

// TestClaimsAreLocalVolumes: a claim is defaulted to class local and a
// filesystem; what a volume on one node cannot give is refused by path;
// its spec is immutable but for a larger request; a Deployment that
// mounts a claim must use Recreate.
func TestClaimsAreLocalVolumes(t *testing.T) {
	objs, err := Parse([]byte(claimYAML), "c.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := objs[0]
	if c.Kind != KindPersistentVolumeClaim || *c.Claim.Spec.StorageClassName != StorageClassLocal || string(*c.Claim.Spec.VolumeMode) != "Filesystem" {
		t.Fatalf("defaults: %+v", c.Claim.Spec)
	}
	b, err := Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := Decode(b); err != nil || back.Claim == nil {
		t.Fatalf("round trip: %v", err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{strings.Replace(claimYAML, "ReadWriteOnce", "ReadWriteMany", 1), `spec.accessModes[0]: Unsupported value: "ReadWriteMany"`},
		{strings.Replace(claimYAML, "{requests: {storage: 1Gi}}", "{}", 1), "spec.resources.requests.storage: Required value"},
		{strings.Replace(claimYAML, "1Gi", "0", 1), "spec.resources.requests.storage: Invalid value"},
		{claimYAML + "  storageClassName: nfs\n", `spec.storageClassName: Unsupported value: "nfs"`},
		{claimYAML + "  selector: {matchLabels: {a: b}}\n", "spec.selector"},
	} {
		_, err := Parse([]byte(tc.yaml), "c.yaml")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.yaml, err, tc.want)
		}
	}
	bigger, _ := Parse([]byte(strings.Replace(claimYAML, "1Gi", "2Gi", 1)), "c.yaml")
	if errs := ValidateUpdate(c, bigger[0]); len(errs) != 0 {
		t.Fatalf("a larger request refused: %v", errs)
	}
	if errs := ValidateUpdate(bigger[0], c); len(errs) == 0 {
		t.Fatal("a smaller request taken")
	}
	rwop, _ := Parse([]byte(strings.Replace(claimYAML, "ReadWriteOnce", "ReadWriteOncePod", 1)), "c.yaml")
	if errs := ValidateUpdate(c, rwop[0]); len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), "immutable") {
		t.Fatalf("access modes changed: %v", errs)
	}

	dep := workloadYAML("Deployment", "db", `      containers: [{name: db, image: db, volumeMounts: [{name: d, mountPath: /data}]}]
      volumes: [{name: d, persistentVolumeClaim: {claimName: data}}]
`)
	_, err = Parse([]byte(dep), "d.yaml")
	if err == nil || !strings.Contains(err.Error(), "spec.strategy.type") || !strings.Contains(err.Error(), "Recreate") {
		t.Fatalf("a rolling Deployment on a claim: %v", err)
	}
	if _, err := Parse([]byte(strings.Replace(dep, "spec:\n  selector", "spec:\n  strategy: {type: Recreate}\n  selector", 1)), "d.yaml"); err != nil {
		t.Fatalf("a Recreate Deployment on a claim: %v", err)
	}
	if _, err := Parse([]byte(strings.Replace(strings.Replace(dep, "claimName: data", "claimName: Data_1", 1), "spec:\n  selector", "spec:\n  strategy: {type: Recreate}\n  selector", 1)), "d.yaml"); err == nil ||
		!strings.Contains(err.Error(), "persistentVolumeClaim.claimName") {
		t.Fatalf("a bad claim name: %v", err)
	}
}

// TestStatefulSetClaimTemplatesAreMountedByName: a pod mounts a
// volumeClaimTemplate by its name; a template that shadows a pod volume,
// a bad retention policy and a mount of no volume are refused; defaults
// are a claim's and Kubernetes' Retain.
func TestStatefulSetClaimTemplatesAreMountedByName(t *testing.T) {
	sts := `apiVersion: apps/v1
kind: StatefulSet
metadata: {name: pg}
spec:
  selector: {matchLabels: {app: pg}}
  serviceName: pg
  template:
    metadata: {labels: {app: pg}}
    spec:
      containers: [{name: pg, image: pg, volumeMounts: [{name: data, mountPath: /var/lib/pg}]}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
`
	objs, err := Parse([]byte(sts), "s.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sp := objs[0].StatefulSet.Spec
	if *sp.VolumeClaimTemplates[0].Spec.StorageClassName != StorageClassLocal || sp.PersistentVolumeClaimRetentionPolicy.WhenDeleted != "Retain" {
		t.Fatalf("defaults: %+v %+v", sp.VolumeClaimTemplates[0].Spec, sp.PersistentVolumeClaimRetentionPolicy)
	}
	for _, tc := range []struct{ edit, want string }{
		{strings.Replace(sts, "name: data, mountPath", "name: logs, mountPath", 1), "volumeMounts[0].name: Not found"},
		{strings.Replace(sts, "  volumeClaimTemplates:", "  persistentVolumeClaimRetentionPolicy: {whenDeleted: Keep}\n  volumeClaimTemplates:", 1), "whenDeleted: Unsupported value"},
		{strings.Replace(sts, "      containers:", "      volumes: [{name: data, emptyDir: {}}]\n      containers:", 1), "spec.volumeClaimTemplates[0].metadata.name: Duplicate"},
	} {
		if _, err := Parse([]byte(tc.edit), "s.yaml"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
}
