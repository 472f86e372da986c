package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
)

func TestDeploymentArgAcceptsKubectlShapesAndNamesTheFix(t *testing.T) {
	tests := []struct {
		args []string
		name string
		err  string
	}{
		{[]string{"deployment/hello"}, "hello", ""},
		{[]string{"deployment", "hello"}, "hello", ""},
		{[]string{"deploy/hello"}, "hello", ""},
		{[]string{"deployments", "hello"}, "hello", ""},
		{[]string{"hello"}, "", "give the kind too, deployment/hello or deployment hello (e.g. starling rollout status deployment/hello)"},
		{[]string{"service/hello"}, "", `"service": only deployments have rollouts`},
		{nil, "", "expected KIND/NAME or KIND NAME"},
		{[]string{"deployment/"}, "", "expected KIND/NAME or KIND NAME"},
	}
	for _, tt := range tests {
		name, err := deploymentArg("status", tt.args)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: err = %v, want %q", tt.args, err, tt.err)
			}
			continue
		}
		if err != nil || name != tt.name {
			t.Errorf("%q: %q, %v; want %q", tt.args, name, err, tt.name)
		}
	}
}

func status(updated, ready, available, old, replicas int) api.RolloutStatus {
	st := api.RolloutStatus{Name: "web", Generation: 2, SpecHash: "cccccccc", Revision: 2, ProgressDeadlineSeconds: 600,
		RolloutCounts: api.RolloutCounts{Replicas: replicas, Updated: updated, Ready: ready, Available: available, Old: old}}
	st.Done = updated == replicas && ready == replicas && old == 0
	return st
}

func TestStatusMessageReadsLikeKubectl(t *testing.T) {
	paused := status(1, 0, 3, 2, 3)
	paused.Paused = true
	tests := []struct {
		st   api.RolloutStatus
		want string
	}{
		{status(1, 0, 3, 2, 3), `Waiting for deployment "web" rollout to finish: 1 out of 3 new replicas have been updated...`},
		{status(3, 3, 3, 1, 3), `Waiting for deployment "web" rollout to finish: 1 old replicas are pending termination...`},
		{status(3, 2, 3, 0, 3), `Waiting for deployment "web" rollout to finish: 2 of 3 updated replicas are available...`},
		{status(3, 3, 3, 0, 3), `deployment "web" successfully rolled out`},
		{paused, `Waiting for deployment "web" rollout to finish: 1 out of 3 new replicas have been updated... (paused: 'starling rollout resume deployment/web' continues it)`},
	}
	for _, tt := range tests {
		if got := statusMessage(tt.st); got != tt.want {
			t.Errorf("statusMessage(%+v) =\n%s\nwant\n%s", tt.st.RolloutCounts, got, tt.want)
		}
	}
}

// fakeClock advances by step on every reading.
type fakeClock struct {
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time { c.t = c.t.Add(c.step); return c.t }

func TestFollowRolloutPrintsChangesAndEndsOnDoneStallOrTimeout(t *testing.T) {
	seq := func(sts ...api.RolloutStatus) func(context.Context) (api.RolloutStatus, error) {
		i := 0
		return func(context.Context) (api.RolloutStatus, error) {
			st := sts[min(i, len(sts)-1)]
			i++
			return st, nil
		}
	}
	t.Run("done", func(t *testing.T) {
		var out bytes.Buffer
		clock := &fakeClock{t: time.Unix(0, 0), step: time.Second}
		err := followRollout(context.Background(), seq(status(0, 0, 2, 2, 2), status(0, 0, 2, 2, 2), status(2, 1, 2, 1, 2), status(2, 2, 2, 0, 2)),
			&statusPrinter{w: &out}, 0, time.Millisecond, clock.now)
		want := `Waiting for deployment "web" rollout to finish: 0 out of 2 new replicas have been updated...
Waiting for deployment "web" rollout to finish: 1 old replicas are pending termination...
deployment "web" successfully rolled out
`
		if err != nil || out.String() != want {
			t.Fatalf("err %v, output:\n%s\nwant:\n%s", err, out.String(), want)
		}
	})
	t.Run("stalled past the progress deadline", func(t *testing.T) {
		stuck := status(1, 0, 2, 1, 2)
		stuck.ProgressDeadlineSeconds = 5
		var out bytes.Buffer
		clock := &fakeClock{t: time.Unix(0, 0), step: time.Second}
		err := followRollout(context.Background(), seq(stuck), &statusPrinter{w: &out}, 0, time.Millisecond, clock.now)
		if err == nil || !strings.Contains(err.Error(), `deployment "web" exceeded its progress deadline: nothing changed for 6s (1 out of 2 new replicas have been updated...)`) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("paused never stalls, timeout ends it", func(t *testing.T) {
		stuck := status(1, 0, 2, 1, 2)
		stuck.ProgressDeadlineSeconds, stuck.Paused = 1, true
		var out bytes.Buffer
		clock := &fakeClock{t: time.Unix(0, 0), step: time.Second}
		err := followRollout(context.Background(), seq(stuck), &statusPrinter{w: &out}, 10*time.Second, time.Millisecond, clock.now)
		if err == nil || !strings.HasPrefix(err.Error(), `timed out after 10s waiting for deployment "web" rollout to finish: 1 out of 2`) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("terminal redraws one line", func(t *testing.T) {
		var out bytes.Buffer
		clock := &fakeClock{t: time.Unix(0, 0), step: time.Second}
		err := followRollout(context.Background(), seq(status(1, 0, 2, 1, 2), status(2, 2, 2, 0, 2)), &statusPrinter{w: &out, width: 100}, 0, time.Millisecond, clock.now)
		got := out.String()
		if err != nil || strings.Count(got, "\r\x1b[K") != 2 || strings.Count(got, "\n") != 2 || !strings.HasSuffix(got, "\ndeployment \"web\" successfully rolled out\n") {
			t.Fatalf("err %v, output %q", err, got)
		}
	})
}

func TestProgressLineFitsTheTerminal(t *testing.T) {
	st := status(3, 2, 5, 1, 6)
	line := progressLine(st, 12*time.Second, 100)
	if want := "web rev 2 [##########--------------------] 2/6 ready, 3/6 updated, 5/6 available, 1 old, 12s"; line != want {
		t.Fatalf("line =\n%q\nwant\n%q", line, want)
	}
	for _, w := range []int{21, 40, 60} {
		if l := progressLine(st, time.Second, w); len(l) > w-1 {
			t.Errorf("width %d: %d columns: %q", w, len(l), l)
		}
	}
	// Full only when done: all ready but an old copy left is not full.
	if l := progressLine(status(6, 6, 6, 1, 6), 0, 100); !strings.Contains(l, "#-]") {
		t.Errorf("not done but full: %q", l)
	}
}

func TestHistoryTableAndRevisionYAML(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	revs := []api.Revision{
		{Revision: 1, SpecHash: "aaaaaaaa", Created: created, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img:v1"}}}}},
		{Revision: 2, SpecHash: "bbbbbbbb", ChangeCause: "bump", Created: created, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img:v2"}}}}},
	}
	var out bytes.Buffer
	if err := printHistory(&out, "web", revs); err != nil {
		t.Fatal(err)
	}
	want := `deployment.apps/web
REVISION   HASH       IMAGE    CHANGE-CAUSE   CREATED
1          aaaaaaaa   img:v1   <none>         2026-01-02T03:04:05Z
2          bbbbbbbb   img:v2   bump           2026-01-02T03:04:05Z
`
	if out.String() != want {
		t.Fatalf("history:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if err := printRevision(&out, "web", revs, 2); err != nil || !strings.HasPrefix(out.String(), "# deployment.apps/web revision 2, spec hash bbbbbbbb\n") || !strings.Contains(out.String(), "image: img:v2") {
		t.Fatalf("revision 2: %v\n%s", err, out.String())
	}
	if err := printRevision(&out, "web", revs, 7); err == nil || err.Error() != `revision 7 of deployment "web" not found (recorded: 1, 2)` {
		t.Fatalf("missing revision: %v", err)
	}
}
