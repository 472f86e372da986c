package reconcile

import (
	"strings"
	"testing"
	"time"
)

// TestProjectVolumeAsTheKubeletPlugins: every key (binaryData too) or
// the listed items with their modes, downward API files (labels as
// sorted key="value" lines), later sources winning a path; a missing
// object or listed key names it unless optional.
func TestProjectVolumeAsTheKubeletPlugins(t *testing.T) {
	src := fakeConfig{
		maps:    map[string]map[string]string{"ns/app": {"app.conf": "color=blue", "mode": "fast"}},
		binary:  map[string]map[string][]byte{"ns/app": {"logo.png": {0x89, 'P'}}},
		secrets: map[string]map[string][]byte{"ns/db": {"password": []byte("pw")}},
	}
	r := Replica{Name: "web-1", Namespace: "ns", UID: "u", SpecHash: "abcdef12",
		Spec: Spec{Labels: map[string]string{"tier": "web", "app": "shop"}}}
	files, err := ProjectVolume(Volume{Name: "cfg", Sources: []FileSource{{ConfigMap: "app"}}}, r, src, Allocatable{})
	if err != nil || len(files) != 3 || files[0].Path != "app.conf" || files[1].Path != "logo.png" || files[2].Mode != 0o644 {
		t.Fatalf("configMap volume: %+v %v", files, err)
	}
	files, err = ProjectVolume(Volume{Name: "all", DefaultMode: 0o440, Sources: []FileSource{
		{ConfigMap: "app", Items: []KeyToPath{{Key: "mode", Path: "conf/mode", Mode: 0o600}}},
		{Secret: "db", Items: []KeyToPath{{Key: "password", Path: "conf/mode"}}},
		{Fields: []FieldFile{{Path: "labels", FieldPath: "metadata.labels"}, {Path: "tier", FieldPath: "metadata.labels['tier']"}, {Path: "name", FieldPath: "metadata.name"},
			{Path: "cpu", Value: "2"}, {Path: "mem", Resource: "limits.memory", DivisorMilli: 1 << 20 * 1000}}},
		{ConfigMap: "missing", Optional: true},
	}}, r, src, Allocatable{MilliCPU: 4000, MemoryBytes: 3 << 30})
	var got []string
	for _, f := range files {
		got = append(got, f.Path+"="+string(f.Data))
	}
	want := `conf/mode=pw|cpu=2|labels=app="shop"` + "\n" + `tier="web"|mem=3072|name=web-1|tier=web`
	if err != nil || strings.Join(got, "|") != want || files[0].Mode != 0o440 {
		t.Fatalf("projected volume:\n got %q %v\nwant %q", strings.Join(got, "|"), err, want)
	}
	for _, c := range []struct {
		v    Volume
		want string
	}{
		{Volume{Sources: []FileSource{{ConfigMap: "none"}}}, `configmap "none" not found`},
		{Volume{Sources: []FileSource{{Secret: "db", Items: []KeyToPath{{Key: "user", Path: "u"}}}}}, "secret references non-existent secret key: user"},
	} {
		if _, err := ProjectVolume(c.v, r, src, Allocatable{}); err == nil || err.Error() != c.want {
			t.Errorf("%+v: %v, want %q", c.v, err, c.want)
		}
	}
	if !(Volume{Sources: []FileSource{{ConfigMap: "a"}, {Secret: "b"}}}).Sensitive() || (Volume{Sources: []FileSource{{ConfigMap: "a"}}}).Sensitive() {
		t.Fatal("Sensitive")
	}
}

// TestEvictedContainerIsReplaced: a container evicted (an emptyDir over
// its sizeLimit) is replaced by a fresh copy, with the reason.
func TestEvictedContainerIsReplaced(t *testing.T) {
	r := Replica{ID: "ns_web-1", Name: "web-1", Namespace: "ns", Workload: "web", SpecHash: "abcdef12"}
	c := Container{ID: r.ID, Name: r.Name, Namespace: "ns", Workload: "web", SpecHash: "abcdef12", State: StateRunning, PodIP: "10.22.1.5"}
	observed := Local{Evicted: map[string]string{r.ID: "Usage of EmptyDir volume \"s\" exceeds the limit \"1Mi\"."}}.Mark([]Container{c})
	res := Plan([]Replica{r}, observed, time.Now())
	if len(res.Actions) != 1 || res.Actions[0].Type != Replace || !strings.HasPrefix(res.Actions[0].Reason, "Evicted: Usage of EmptyDir") {
		t.Fatalf("actions %+v", res.Actions)
	}
	if res := Plan([]Replica{r}, Local{}.Mark([]Container{c}), time.Now()); len(res.Actions) != 0 {
		t.Fatalf("a container not evicted got %+v", res.Actions)
	}
}
