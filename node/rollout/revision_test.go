package rollout

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// dep is Deployment default/web running image, with history limit limit
// (-1: unset) and change cause cause ("" none).
func dep(image string, limit int32, cause string) *appsv1.Deployment {
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}},
			},
		},
	}
	if limit >= 0 {
		d.Spec.RevisionHistoryLimit = &limit
	}
	if cause != "" {
		d.Annotations = map[string]string{ChangeCauseAnnotation: cause}
	}
	return d
}

// history is a store of one Deployment's revision records by hash.
type history map[string]api.Revision

// apply records d as the agent does and returns the change.
func (h history) apply(d *appsv1.Deployment, now time.Time) Change {
	var existing []api.Revision
	for _, r := range h {
		existing = append(existing, r)
	}
	ch := Record(existing, d, now)
	for _, r := range ch.Put {
		h[r.SpecHash] = r
	}
	for _, r := range ch.Drop {
		delete(h, r.SpecHash)
	}
	return ch
}

// numbers renders the history as "image:revision" sorted by revision.
func (h history) numbers() string {
	var rs []api.Revision
	for _, r := range h {
		rs = append(rs, r)
	}
	SortNewestFirst(rs)
	var out []string
	for i := len(rs) - 1; i >= 0; i-- {
		out = append(out, fmt.Sprintf("%s:%d", rs[i].Template.Spec.Containers[0].Image, rs[i].Revision))
	}
	return strings.Join(out, " ")
}

func TestRecordNumbersAndPrunesRevisionsLikeKubernetes(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	type step struct {
		image string
		limit int32
		want  string // history after the step
		puts  int    // records written by the step
		drops int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"first apply is revision 1", []step{{"a", -1, "a:1", 1, 0}}},
		{"new template is the highest plus one", []step{{"a", -1, "a:1", 1, 0}, {"b", -1, "a:1 b:2", 1, 0}, {"c", -1, "a:1 b:2 c:3", 1, 0}}},
		{"same template again writes nothing", []step{{"a", -1, "a:1", 1, 0}, {"a", -1, "a:1", 0, 0}}},
		{"old template comes back renumbered", []step{{"a", -1, "a:1", 1, 0}, {"b", -1, "a:1 b:2", 1, 0}, {"a", -1, "b:2 a:3", 1, 0}}},
		{"history limit keeps the newest old revisions", []step{
			{"a", 2, "a:1", 1, 0}, {"b", 2, "a:1 b:2", 1, 0}, {"c", 2, "a:1 b:2 c:3", 1, 0},
			{"d", 2, "b:2 c:3 d:4", 1, 1}, {"e", 2, "c:3 d:4 e:5", 1, 1},
		}},
		{"limit 0 keeps only the current revision", []step{{"a", 0, "a:1", 1, 0}, {"b", 0, "b:2", 1, 1}}},
		{"lowering the limit prunes at once", []step{
			{"a", -1, "a:1", 1, 0}, {"b", -1, "a:1 b:2", 1, 0}, {"c", -1, "a:1 b:2 c:3", 1, 0}, {"c", 1, "b:2 c:3", 0, 1},
		}},
		{"default limit is 10", []step{
			{"a", -1, "a:1", 1, 0}, {"b", -1, "", 1, 0}, {"c", -1, "", 1, 0}, {"d", -1, "", 1, 0}, {"e", -1, "", 1, 0},
			{"f", -1, "", 1, 0}, {"g", -1, "", 1, 0}, {"h", -1, "", 1, 0}, {"i", -1, "", 1, 0}, {"j", -1, "", 1, 0},
			{"k", -1, "a:1 b:2 c:3 d:4 e:5 f:6 g:7 h:8 i:9 j:10 k:11", 1, 0},
			{"l", -1, "b:2 c:3 d:4 e:5 f:6 g:7 h:8 i:9 j:10 k:11 l:12", 1, 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := history{}
			for i, s := range tt.steps {
				ch := h.apply(dep(s.image, s.limit, ""), t0.Add(time.Duration(i)*time.Minute))
				if len(ch.Put) != s.puts || len(ch.Drop) != s.drops {
					t.Errorf("step %d (%s): %d puts, %d drops; want %d, %d", i, s.image, len(ch.Put), len(ch.Drop), s.puts, s.drops)
				}
				if s.want != "" && h.numbers() != s.want {
					t.Errorf("step %d (%s): history %q, want %q", i, s.image, h.numbers(), s.want)
				}
			}
		})
	}
}

func TestRecordKeepsCreationTimeAndFollowsChangeCause(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := history{}
	h.apply(dep("a", -1, "first"), t0)
	h.apply(dep("b", -1, "second"), t0.Add(time.Minute))
	ha := manifest.SpecHash(dep("a", -1, ""))
	if got := h[ha]; got.Revision != 1 || got.ChangeCause != "first" || !got.Created.Equal(t0) || got.Namespace != "default" || got.Deployment != "web" {
		t.Fatalf("revision 1 = %+v", got)
	}
	// Back to a without a cause: renumbered, its creation time and cause kept.
	h.apply(dep("a", -1, ""), t0.Add(2*time.Minute))
	if got := h[ha]; got.Revision != 3 || got.ChangeCause != "first" || !got.Created.Equal(t0) {
		t.Fatalf("renumbered revision = %+v", got)
	}
	// Annotating the current template with a cause updates its record.
	ch := h.apply(dep("a", -1, "rollback to a"), t0.Add(3*time.Minute))
	if len(ch.Put) != 1 || h[ha].ChangeCause != "rollback to a" || h[ha].Revision != 3 {
		t.Fatalf("cause update: %+v, record %+v", ch, h[ha])
	}
	// A template label change keeps the hash and the number, updates the template.
	d := dep("a", -1, "rollback to a")
	d.Spec.Template.Labels["tier"] = "web"
	ch = h.apply(d, t0.Add(4*time.Minute))
	if len(ch.Put) != 1 || h[ha].Revision != 3 || h[ha].Template.Labels["tier"] != "web" {
		t.Fatalf("label update: %+v, record %+v", ch, h[ha])
	}
}

func TestRecordRenumbersACurrentRevisionThatSharesTheHighestNumber(t *testing.T) {
	// Two nodes recorded different templates concurrently, both as 2.
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a, b := dep("a", -1, ""), dep("b", -1, "")
	existing := []api.Revision{
		{SpecHash: manifest.SpecHash(a), Revision: 2, Created: t0},
		{SpecHash: manifest.SpecHash(b), Revision: 2, Created: t0},
	}
	ch := Record(existing, a, t0)
	if len(ch.Put) != 1 || ch.Put[0].Revision != 3 {
		t.Fatalf("change = %+v, want a renumbered to 3", ch)
	}
}

// TestRecordInvariants applies random template sequences with random
// limits and checks what every history must satisfy.
func TestRecordInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := history{}
		images := rapid.SliceOfN(rapid.SampledFrom([]string{"a", "b", "c", "d", "e"}), 1, 30).Draw(t, "images")
		limits := rapid.SliceOfN(rapid.Int32Range(-1, 4), len(images), len(images)).Draw(t, "limits")
		var last int64
		for i, img := range images {
			d := dep(img, limits[i], "")
			h.apply(d, time.Unix(int64(i), 0))
			cur, ok := h[manifest.SpecHash(d)]
			if !ok {
				t.Fatalf("step %d: current template %s not recorded", i, img)
			}
			seen := map[int64]bool{}
			for _, r := range h {
				if seen[r.Revision] {
					t.Fatalf("step %d: revision %d twice: %s", i, r.Revision, h.numbers())
				}
				seen[r.Revision] = true
				if r.SpecHash != cur.SpecHash && r.Revision >= cur.Revision {
					t.Fatalf("step %d: current %s is %d, not above %d", i, img, cur.Revision, r.Revision)
				}
			}
			if cur.Revision < last {
				t.Fatalf("step %d: current revision went down %d -> %d", i, last, cur.Revision)
			}
			last = cur.Revision
			limit := DefaultHistoryLimit
			if limits[i] >= 0 {
				limit = int(limits[i])
			}
			if len(h)-1 > limit {
				t.Fatalf("step %d: %d old revisions kept, limit %d", i, len(h)-1, limit)
			}
		}
	})
}

func TestTargetPicksPreviousOrNamedRevision(t *testing.T) {
	revs := []api.Revision{{SpecHash: "aaaaaaaa", Revision: 1}, {SpecHash: "cccccccc", Revision: 4}, {SpecHash: "bbbbbbbb", Revision: 3}}
	tests := []struct {
		name    string
		current string
		to      int64
		want    string
		err     string
	}{
		{"previous is the newest other hash", "cccccccc", 0, "bbbbbbbb", ""},
		{"previous when current is unrecorded", "dddddddd", 0, "cccccccc", ""},
		{"named revision", "cccccccc", 1, "aaaaaaaa", ""},
		{"named revision equal to current", "cccccccc", 4, "cccccccc", ""},
		{"unknown revision", "cccccccc", 2, "", "unable to find revision 2 in history (recorded: 1, 3, 4)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Target(revs, tt.current, tt.to)
			if tt.err != "" {
				if !errors.Is(err, ErrNoRevision) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want ErrNoRevision with %q", err, tt.err)
				}
				return
			}
			if err != nil || got.SpecHash != tt.want {
				t.Fatalf("Target = %s, %v; want %s", got.SpecHash, err, tt.want)
			}
		})
	}
	if _, err := Target(revs[:1], "aaaaaaaa", 0); !errors.Is(err, ErrNoRevision) || !strings.Contains(err.Error(), "no previous revision") {
		t.Fatalf("only the current revision: %v", err)
	}
	if _, err := Target(nil, "aaaaaaaa", 0); err == nil || !strings.Contains(err.Error(), "none recorded") {
		t.Fatalf("no revisions: %v", err)
	}
}

func TestOfRejectsOtherDeploymentsSharingThePrefix(t *testing.T) {
	r := api.Revision{Namespace: "default", Deployment: "web-api", SpecHash: "aaaaaaaa"}
	key := Key("default", "web-api", "aaaaaaaa")
	if !strings.HasPrefix(key, Prefix("default", "web")) {
		t.Fatal("test premise: web's prefix covers web-api's keys")
	}
	if Of(key, r, "default", "web") {
		t.Fatal("web-api's revision counted as web's")
	}
	if !Of(key, r, "default", "web-api") {
		t.Fatal("web-api's own revision not recognised")
	}
	if Of(Key("default", "web-api", "bbbbbbbb"), r, "default", "web-api") {
		t.Fatal("a record under another hash's key accepted")
	}
}
