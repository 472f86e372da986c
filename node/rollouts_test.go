package node

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/rollout"
	"github.com/starling-orchestrator/starling/node/store"
	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/test/harness"
)

// call sends one API request to n's handler and decodes a 2xx answer
// into out; it returns the status and, for errors, the message.
func call(t *testing.T, n *testNode, method, path string, body any, out any) (int, string) {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	rec := httptest.NewRecorder()
	n.agent.handler().ServeHTTP(rec, httptest.NewRequest(method, path, rd))
	if rec.Code/100 != 2 {
		var e api.Error
		json.Unmarshal(rec.Body.Bytes(), &e)
		return rec.Code, e.Error
	}
	if out != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, rec.Body.String(), err)
		}
	}
	return rec.Code, ""
}

// deployWith applies Deployment name with image, env MESSAGE=message and
// edits on n.
func deployWith(t *testing.T, n *testNode, name string, replicas int, image, message string, edits ...func(*appsv1.Deployment)) {
	t.Helper()
	storeObjects(t, n, testDeployment(t, harness.App{Name: name, Replicas: int32(replicas), Container: "c", Image: image,
		Env: harness.Env("MESSAGE", message)}, edits...))
}

// keepOneRevision sets a Deployment's revisionHistoryLimit to 1.
func keepOneRevision(d *appsv1.Deployment) { d.Spec.RevisionHistoryLimit = new(int32(1)) }

func storedHash(t *testing.T, n *testNode, name string) string {
	t.Helper()
	o, err := manifest.Decode([]byte(storedValue(n, manifest.KeyFor(manifest.KindDeployment, "default", name))))
	if err != nil {
		t.Fatal(err)
	}
	return manifest.SpecHash(o.Deployment)
}

// waitRolledOut waits until n's status endpoint says web's rollout is
// done with hash and revision.
func waitRolledOut(t *testing.T, n *testNode, name, hash string, revision int64) api.RolloutStatus {
	t.Helper()
	var st api.RolloutStatus
	waitFor(t, 15*time.Second, func() error {
		if code, msg := call(t, n, "GET", "/v1/rollout/default/"+name+"/status", nil, &st); code != 200 {
			return fmt.Errorf("status: %d %s", code, msg)
		}
		if !st.Done || st.SpecHash != hash || st.Revision != revision {
			return fmt.Errorf("%s: status %+v, want done with hash %s, revision %d", n.name, st, hash, revision)
		}
		return nil
	})
	return st
}

func history(t *testing.T, n *testNode, name string) string {
	t.Helper()
	var l api.RevisionList
	if code, msg := call(t, n, "GET", "/v1/rollout/default/"+name+"/history", nil, &l); code != 200 {
		t.Fatalf("history: %d %s", code, msg)
	}
	var out []string
	for _, r := range l.Items {
		out = append(out, fmt.Sprintf("%d:%s", r.Revision, r.Template.Spec.Containers[0].Env[0].Value))
	}
	return strings.Join(out, " ")
}

// TestRolloutAPIRecordsRevisionsUndoesRestartsAndPauses drives the rollout
// endpoints of one agent of two, checking the other sees the same
// (revision records gossip like any record).
func TestRolloutAPIRecordsRevisionsUndoesRestartsAndPauses(t *testing.T) {
	nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]
	deployWith(t, a, "web", 3, "img:v1", "one")
	h1 := storedHash(t, a, "web")
	st := waitRolledOut(t, a, "web", h1, 1)
	if st.RolloutCounts != (api.RolloutCounts{Replicas: 3, Updated: 3, Ready: 3, Available: 3}) || st.ProgressDeadlineSeconds != 600 || st.Generation != 1 {
		t.Fatalf("status after first rollout: %+v", st)
	}
	deployWith(t, a, "web", 3, "img:v1", "two")
	h2 := storedHash(t, a, "web")
	waitRolledOut(t, b, "web", h2, 2)
	// Gossip delivers records in no promised order: b may see revision 2
	// (and a's status saying it rolled out) a tick before revision 1.
	waitFor(t, 5*time.Second, func() error {
		if got := history(t, b, "web"); got != "1:one 2:two" {
			return fmt.Errorf("history on the other node = %q", got)
		}
		return nil
	})

	// Undo goes back to revision 1's template, renumbered 3.
	var res api.ApplyResult
	if code, msg := call(t, b, "POST", "/v1/rollout/default/web/undo", api.UndoRequest{}, &res); code != 200 || res.Result != "rolled back" {
		t.Fatalf("undo: %d %s %+v", code, msg, res)
	}
	if got := storedHash(t, b, "web"); got != h1 {
		t.Fatalf("after undo the hash is %s, want revision 1's %s", got, h1)
	}
	waitRolledOut(t, a, "web", h1, 3)
	if got := history(t, a, "web"); got != "2:two 3:one" {
		t.Fatalf("history after undo = %q", got)
	}
	for _, n := range []*testNode{a, b} {
		for id, hash := range n.rt.specHashes() {
			if hash != h1 {
				t.Fatalf("after undo %s (spec %s) still runs on %s", id, hash, n.name)
			}
		}
	}
	code, msg := call(t, a, "POST", "/v1/rollout/default/web/undo", api.UndoRequest{ToRevision: 9}, nil)
	if code != http.StatusNotFound || !strings.Contains(msg, "unable to find revision 9 in history (recorded: 2, 3)") || !strings.Contains(msg, "rollout history") {
		t.Fatalf("undo to a missing revision: %d %q", code, msg)
	}
	if code, _ := call(t, a, "POST", "/v1/rollout/default/web/undo", api.UndoRequest{ToRevision: 3}, &res); code != 200 || !strings.HasPrefix(res.Result, "skipped rollback") {
		t.Fatalf("undo to the current revision: %d %+v", code, res)
	}

	// Restart: a new hash with the same image and env.
	if code, msg := call(t, a, "POST", "/v1/rollout/default/web/restart", nil, &res); code != 200 || res.Result != "restarted" {
		t.Fatalf("restart: %d %s", code, msg)
	}
	h4 := storedHash(t, a, "web")
	if h4 == h1 {
		t.Fatal("restart kept the hash")
	}
	waitRolledOut(t, b, "web", h4, 4)

	// Pause and resume, with the refusals kubectl makes.
	for _, step := range []struct {
		action string
		code   int
		msg    string
	}{
		{"pause", 200, ""},
		{"pause", http.StatusConflict, `deployment "web" is already paused`},
		{"restart", http.StatusConflict, "resume it first with 'starling rollout resume deployment/web'"},
		{"undo", http.StatusConflict, "cannot be rolled back"},
		{"resume", 200, ""},
		{"resume", http.StatusConflict, `deployment "web" is not paused`},
	} {
		code, msg := call(t, a, "POST", "/v1/rollout/default/web/"+step.action, api.UndoRequest{}, nil)
		if code != step.code || !strings.Contains(msg, step.msg) {
			t.Fatalf("%s: %d %q, want %d %q", step.action, code, msg, step.code, step.msg)
		}
	}
	var after api.RolloutStatus
	call(t, a, "GET", "/v1/rollout/default/web/status", nil, &after)
	if after.Paused || after.Generation != 6 || after.SpecHash != h4 {
		t.Fatalf("status after pause and resume: %+v (want generation 6: 2 applies, undo, restart, pause, resume)", after)
	}

	// Deleting the Deployment deletes its revisions, on every node.
	if code, msg := call(t, a, "DELETE", "/v1/objects/deployment/default/web", nil, nil); code != 200 {
		t.Fatalf("delete: %d %s", code, msg)
	}
	waitFor(t, 10*time.Second, func() error {
		for _, n := range nodes {
			recs, err := n.agent.store.List(rollout.Prefix("default", "web"))
			if err != nil {
				return err
			}
			for _, r := range recs {
				if !r.Deleted {
					return fmt.Errorf("%s still holds %s", n.name, r.Key)
				}
			}
		}
		return nil
	})
	if code, msg := call(t, a, "GET", "/v1/rollout/default/web/history", nil, nil); code != http.StatusNotFound || !strings.Contains(msg, `deployment "web" not found`) {
		t.Fatalf("history of a deleted deployment: %d %q", code, msg)
	}
}

func TestRevisionHistoryLimitPrunesStoredRecords(t *testing.T) {
	n := startCluster(t, 1)[0]
	for _, msg := range []string{"a", "b", "c", "d"} {
		deployWith(t, n, "lim", 1, "img:v1", msg, keepOneRevision)
	}
	if got := history(t, n, "lim"); got != "3:c 4:d" {
		t.Fatalf("history = %q, want the current revision and one old one", got)
	}
	// Re-applying the same Deployment rewrites no revision record (their
	// values went through JSON and must still compare equal).
	before, _ := n.agent.store.List(rollout.Prefix("default", "lim"))
	deployWith(t, n, "lim", 1, "img:v1", "d", keepOneRevision)
	after, _ := n.agent.store.List(rollout.Prefix("default", "lim"))
	if len(before) != len(after) {
		t.Fatalf("re-apply changed the records: %d -> %d", len(before), len(after))
	}
	for i := range before {
		if !before[i].Equal(after[i]) {
			t.Fatalf("re-apply rewrote %s", after[i].Key)
		}
	}
	// Another Deployment whose name extends this one's keeps its own history.
	deployWith(t, n, "lim-2", 1, "img:v1", "x")
	if got := history(t, n, "lim"); got != "3:c 4:d" {
		t.Fatalf("history after lim-2 = %q", got)
	}
	if got := history(t, n, "lim-2"); got != "1:x" {
		t.Fatalf("lim-2 history = %q", got)
	}
}

func TestRolloutStatusCountsOnlyLiveNodesCopies(t *testing.T) {
	d := testDeployment(t, harness.App{Name: "web", Replicas: 1, Container: "c", Image: "img"},
		func(d *appsv1.Deployment) { d.Spec.ProgressDeadlineSeconds = new(int32(30)) }).Deployment
	hash := manifest.SpecHash(d)
	cur := api.Replica{Namespace: "default", Workload: "web", SpecHash: hash, Phase: api.PhaseRunning, Ready: true}
	old := api.Replica{Namespace: "default", Workload: "web", SpecHash: "00000000", Phase: api.PhaseRunning, Ready: true}
	v := &view.View{
		Alive:    map[string]bool{"a": true},
		Statuses: map[string]view.NodeStatus{"a": {Name: "a", Replicas: []api.Replica{cur}}, "dead": {Name: "dead", Replicas: []api.Replica{old}}},
	}
	st := rolloutStatus(d, []api.Revision{{SpecHash: hash, Revision: 5}}, v.LiveReplicas())
	if !st.Done || st.Old != 0 || st.Revision != 5 || st.ProgressDeadlineSeconds != 30 {
		t.Fatalf("status = %+v: a dead node's old copy must not hold the rollout back", st)
	}
	v.Alive["dead"] = true
	if st := rolloutStatus(d, nil, v.LiveReplicas()); st.Done || st.Old != 1 || st.Revision != 0 {
		t.Fatalf("status with the node alive = %+v", st)
	}
	// A record an earlier run of its node wrote (back from a crash, its
	// new record not yet here) lists copies of unknown state: rollout
	// status, as the rollout gate, does not count them ready, and get
	// replicas shows them Unknown.
	v.Alive["dead"] = false
	v.Stale = map[string]bool{"a": true}
	if st := rolloutStatus(d, nil, v.LiveReplicas()); st.Done || st.Ready != 0 || st.Updated != 1 {
		t.Fatalf("status with a's record stale = %+v, want 1 updated, none ready", st)
	}
	if r := v.Reported("a")[0]; r.Phase != api.PhaseUnknown || r.Ready || r.Reason != view.StaleReason {
		t.Fatalf("a stale record's copy reads %s, ready %v, reason %q", r.Phase, r.Ready, r.Reason)
	}
	if v.Statuses["a"].Replicas[0].Phase != api.PhaseRunning {
		t.Fatal("reported changed the record it read")
	}
	// get nodes counts none of them on a (it counted 1 before).
	if n := v.Holding("a"); n != 0 {
		t.Fatalf("get nodes counts %d replicas on a stale record, want 0", n)
	}
	v.Stale = nil
	if n := v.Holding("a"); n != 1 {
		t.Fatalf("get nodes counts %d replicas on a current record, want 1", n)
	}
	v.Stale = map[string]bool{"a": true}
	// A stale record's copy that is going, or has no container, keeps
	// its phase (rollout status does not count a Terminating copy).
	going := cur
	going.Phase = api.PhaseTerminating
	v.Statuses["a"] = view.NodeStatus{Name: "a", Replicas: []api.Replica{going}}
	if st := rolloutStatus(d, nil, v.LiveReplicas()); st.Updated != 0 || st.Ready != 0 {
		t.Fatalf("status with a stale record's Terminating copy = %+v, want it not counted", st)
	}
	// This node's own record from before it restarted (it has not
	// published in this run) reads as stale as well.
	started := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	own := view.NodeStatus{Name: "me", Started: started.Add(-time.Minute), Replicas: []api.Replica{cur}}
	if !view.EarlierRun(own, started) || view.EarlierRun(view.NodeStatus{Started: started.Truncate(time.Second)}, started.Add(time.Millisecond)) {
		t.Fatal("earlierRun does not tell this run's record from an earlier one's")
	}
	mine := &view.View{Alive: map[string]bool{"me": true}, Statuses: map[string]view.NodeStatus{"me": own}, OldSelf: "me"}
	if st := rolloutStatus(d, nil, mine.LiveReplicas()); st.Done || st.Ready != 0 {
		t.Fatalf("status from this node's record of its earlier run = %+v, want nothing ready", st)
	}
}

// A revision dated after its record's write reads as dated at the write
// (a peer cannot make its revision sort first among equals by date).
func TestRevisionCreatedIsCappedAtItsWrite(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rev := api.Revision{Namespace: "default", Deployment: "web", Revision: 1, SpecHash: "11111111", Created: w.Add(time.Hour)}
	b, _ := json.Marshal(rev)
	if _, err := st.Apply(crdt.Record{Key: rollout.Key("default", "web", "11111111"), Value: b, Version: hlc.Timestamp{Wall: w.UnixNano()}, Origin: "b"}); err != nil {
		t.Fatal(err)
	}
	revs, _, err := storedRevisions(st, "default", "web", slog.Default())
	if err != nil || len(revs) != 1 {
		t.Fatalf("revisions %v, err %v", revs, err)
	}
	if !revs[0].Created.Equal(w) {
		t.Fatalf("created %v, want the write %v", revs[0].Created, w)
	}
}
