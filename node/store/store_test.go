package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func rec(key string, wall int64, origin, value string) crdt.Record {
	return crdt.Record{Key: key, Value: json.RawMessage(value), Version: hlc.Timestamp{Wall: wall}, Origin: origin}
}

func tomb(key string, wall int64, origin string) crdt.Record {
	return crdt.Record{Key: key, Version: hlc.Timestamp{Wall: wall}, Origin: origin, Deleted: true}
}

func mustApply(t *testing.T, s *Store, r crdt.Record, want bool) {
	t.Helper()
	got, err := s.Apply(r)
	if err != nil {
		t.Fatalf("Apply(%s @%v): %v", r.Key, r.Version, err)
	}
	if got != want {
		t.Fatalf("Apply(%s @%v) = %v, want %v", r.Key, r.Version, got, want)
	}
}

func mustGet(t *testing.T, s *Store, key string) crdt.Record {
	t.Helper()
	r, ok, err := s.Get(key)
	if err != nil || !ok {
		t.Fatalf("Get(%s) = %v, %v", key, ok, err)
	}
	return r
}

func keys(rs []crdt.Record) string {
	var ks []string
	for _, r := range rs {
		ks = append(ks, r.Key)
	}
	return strings.Join(ks, " ")
}

func TestOpenCreatesPrivateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "store")
	open(t, dir)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("dir mode = %v, want 0700", perm)
	}
}

func TestApplyGetList(t *testing.T) {
	s := open(t, t.TempDir())
	if _, ok, err := s.Get("svc/default/web"); ok || err != nil {
		t.Fatalf("Get on empty store = %v, %v; want absent", ok, err)
	}
	for _, r := range []crdt.Record{
		rec("svc/default/web", 10, "n1", `{"image":"nginx"}`),
		rec("svc/default/db", 10, "n1", `{"image":"postgres"}`),
		rec("svc/edge/cam", 10, "n2", `{}`),
		rec("deploy/default/web", 10, "n2", `1`),
		tomb("svc/default/old", 10, "n2"),
	} {
		mustApply(t, s, r, true)
	}
	got := mustGet(t, s, "svc/default/web")
	if want := rec("svc/default/web", 10, "n1", `{"image":"nginx"}`); !got.Equal(want) {
		t.Errorf("Get = %+v, want %+v", got, want)
	}
	tests := []struct{ prefix, want string }{
		{"", "deploy/default/web svc/default/db svc/default/old svc/default/web svc/edge/cam"},
		{"svc/", "svc/default/db svc/default/old svc/default/web svc/edge/cam"},
		{"svc/default/", "svc/default/db svc/default/old svc/default/web"},
		{"svc/default/w", "svc/default/web"},
		{"nope/", ""},
	}
	for _, tt := range tests {
		rs, err := s.List(tt.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", tt.prefix, err)
		}
		if got := keys(rs); got != tt.want {
			t.Errorf("List(%q) = [%s], want [%s]", tt.prefix, got, tt.want)
		}
	}
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap) != 5 || !snap["svc/default/old"].Deleted {
		t.Errorf("Snapshot = %v, want 5 records with the tombstone", snap)
	}
}

func TestApplyIgnoresOlderWrite(t *testing.T) {
	s := open(t, t.TempDir())
	newer := rec("svc/default/web", 20, "n1", `"new"`)
	mustApply(t, s, newer, true)
	mustApply(t, s, rec("svc/default/web", 19, "n9", `"old"`), false)
	mustApply(t, s, rec("svc/default/web", 20, "n0", `"same time, lower origin"`), false)
	mustApply(t, s, newer, false) // duplicate delivery
	if got := mustGet(t, s, "svc/default/web"); !got.Equal(newer) {
		t.Errorf("Get = %+v, want %+v", got, newer)
	}
	higherOrigin := rec("svc/default/web", 20, "n2", `"same time, higher origin"`)
	mustApply(t, s, higherOrigin, true)
	if got := mustGet(t, s, "svc/default/web"); !got.Equal(higherOrigin) {
		t.Errorf("Get = %+v, want %+v", got, higherOrigin)
	}
}

func TestTombstoneWinsAndHides(t *testing.T) {
	s := open(t, t.TempDir())
	mustApply(t, s, rec("svc/default/web", 10, "n1", `"v1"`), true)
	del := tomb("svc/default/web", 11, "n2")
	mustApply(t, s, del, true)
	got := mustGet(t, s, "svc/default/web")
	if !got.Deleted || len(got.Value) != 0 || !got.Equal(del) {
		t.Errorf("after delete Get = %+v, want tombstone %+v", got, del)
	}
	// A write older than the delete, delivered late, must not resurrect it.
	mustApply(t, s, rec("svc/default/web", 10, "n3", `"late"`), false)
	if got := mustGet(t, s, "svc/default/web"); !got.Deleted {
		t.Errorf("late older write resurrected the record: %+v", got)
	}
	// A newer write re-creates it.
	mustApply(t, s, rec("svc/default/web", 12, "n1", `"v2"`), true)
	if got := mustGet(t, s, "svc/default/web"); got.Deleted || string(got.Value) != `"v2"` {
		t.Errorf("re-create: Get = %+v", got)
	}
}

func TestApplyRejectsInvalidRecord(t *testing.T) {
	s := open(t, t.TempDir())
	for _, r := range []crdt.Record{
		rec("no-slashes", 1, "n", `1`),
		rec("a/b/c", 1, "", `1`),
		rec("a/b/c", 1, "n", `{bad json`),
	} {
		if _, err := s.Apply(r); !errors.Is(err, crdt.ErrInvalidRecord) {
			t.Errorf("Apply(%+v) error = %v, want crdt.ErrInvalidRecord", r, err)
		}
	}
	// One invalid record fails the whole batch.
	written, err := s.ApplyAll([]crdt.Record{rec("a/b/c", 1, "n", `1`), rec("bad", 1, "n", `1`)})
	if !errors.Is(err, crdt.ErrInvalidRecord) || written != nil {
		t.Errorf("ApplyAll with an invalid record = %v, %v", written, err)
	}
	if _, ok, _ := s.Get("a/b/c"); ok {
		t.Error("valid record of a failed batch was written")
	}
}

func TestApplyAll(t *testing.T) {
	s := open(t, t.TempDir())
	mustApply(t, s, rec("svc/default/a", 10, "n1", `"stored"`), true)
	written, err := s.ApplyAll([]crdt.Record{
		rec("svc/default/a", 5, "n1", `"older than stored"`),
		rec("svc/default/b", 10, "n1", `"b1"`),
		rec("svc/default/c", 10, "n1", `"c1"`),
		rec("svc/default/b", 12, "n1", `"b2 supersedes b1"`),
		rec("svc/default/c", 9, "n1", `"loses to c1"`),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := keys(written), "svc/default/b svc/default/c"; got != want {
		t.Fatalf("written keys = [%s], want [%s]", got, want)
	}
	if string(written[0].Value) != `"b2 supersedes b1"` || string(written[1].Value) != `"c1"` {
		t.Errorf("written = %+v", written)
	}
	for key, want := range map[string]string{"svc/default/a": `"stored"`, "svc/default/b": `"b2 supersedes b1"`, "svc/default/c": `"c1"`} {
		if got := mustGet(t, s, key); string(got.Value) != want {
			t.Errorf("Get(%s).Value = %s, want %s", key, got.Value, want)
		}
	}
	if written, err := s.ApplyAll(nil); written != nil || err != nil {
		t.Errorf("ApplyAll(nil) = %v, %v", written, err)
	}
}

func TestApplyAllTooLargeWritesNothing(t *testing.T) {
	s := open(t, t.TempDir())
	big := `"` + strings.Repeat("x", 900<<10) + `"`
	var rs []crdt.Record
	for i := range 4 { // 3.6 MiB, over one transaction's 2.4 MiB
		rs = append(rs, rec(fmt.Sprintf("svc/default/big%d", i), 1, "n", big))
	}
	written, err := s.ApplyAll(rs)
	if !errors.Is(err, ErrBatchTooLarge) || written != nil {
		t.Fatalf("ApplyAll(3.6 MiB) = %d records, %v; want ErrBatchTooLarge", len(written), err)
	}
	if all, err := s.List(""); err != nil || len(all) != 0 {
		t.Errorf("after failed batch List = %d records, %v; want none", len(all), err)
	}
	// Each record alone fits, even a maximal one.
	for _, r := range rs[:2] {
		mustApply(t, s, r, true)
	}
	max := rec("svc/default/max", 1, "n", `"`+strings.Repeat("y", crdt.MaxValueLen-2)+`"`)
	mustApply(t, s, max, true)
	if got := mustGet(t, s, "svc/default/max"); !got.Equal(max) {
		t.Error("maximal record did not round-trip")
	}
}

func TestPurgeDeletesOnlyExpiredTombstones(t *testing.T) {
	s := open(t, t.TempDir())
	now := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	ttl := 24 * time.Hour
	old, fresh := now.Add(-48*time.Hour).UnixNano(), now.Add(-time.Hour).UnixNano()
	for _, r := range []crdt.Record{
		tomb("svc/default/old-tomb", old, "n"),
		tomb("svc/default/old-tomb2", old, "n"),
		tomb("svc/default/fresh-tomb", fresh, "n"),
		rec("svc/default/old-live", old, "n", `1`),
	} {
		mustApply(t, s, r, true)
	}
	drain(s)
	n, err := s.Purge(now, ttl)
	if err != nil || n != 2 {
		t.Fatalf("Purge = %d, %v; want 2", n, err)
	}
	select {
	case <-s.Changed():
	default:
		t.Error("Purge deleted records but did not signal Changed")
	}
	rs, _ := s.List("")
	if got, want := keys(rs), "svc/default/fresh-tomb svc/default/old-live"; got != want {
		t.Errorf("after Purge List = [%s], want [%s]", got, want)
	}
	if n, err := s.Purge(now, ttl); err != nil || n != 0 {
		t.Errorf("second Purge = %d, %v; want 0", n, err)
	}
}

func TestPurgeManyTombstones(t *testing.T) {
	s := open(t, t.TempDir())
	const n = purgeBatch*2 + 17
	rs := make([]crdt.Record, 0, 500)
	for i := range n {
		rs = append(rs, tomb(fmt.Sprintf("svc/default/t%05d", i), 1, "n"))
		if len(rs) == cap(rs) || i == n-1 {
			if _, err := s.ApplyAll(rs); err != nil {
				t.Fatal(err)
			}
			rs = rs[:0]
		}
	}
	got, err := s.Purge(time.Unix(0, 1e9), time.Millisecond)
	if err != nil || got != n {
		t.Fatalf("Purge = %d, %v; want %d", got, err, n)
	}
}

func TestReopenKeepsEverything(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := crdt.Map{}
	for i := range 50 {
		r := rec(fmt.Sprintf("svc/ns%d/app%d", i%3, i), int64(i+1), "n1", fmt.Sprintf(`{"i":%d}`, i))
		if i%7 == 0 {
			r = tomb(r.Key, r.Version.Wall, r.Origin)
		}
		mustApply(t, s, r, true)
		want.Apply(r)
	}
	if err := s.PutMeta("node-id", []byte("n1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Apply(rec("a/b/c", 1, "n", `1`)); !errors.Is(err, ErrClosed) {
		t.Errorf("Apply after Close: %v, want ErrClosed", err)
	}
	if _, _, err := s.Get("a/b/c"); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: %v, want ErrClosed", err)
	}
	drain(s) // the buffered signal of the last write, if any
	select {
	case _, ok := <-s.Changed():
		if ok {
			t.Error("Changed delivered a value after Close")
		}
	case <-time.After(time.Second):
		t.Error("Changed channel not closed by Close")
	}

	s2 := open(t, dir)
	got, err := s2.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("after reopen %d records, want %d", len(got), len(want))
	}
	for k, r := range want {
		if !got[k].Equal(r) {
			t.Errorf("after reopen %s = %+v, want %+v", k, got[k], r)
		}
	}
	if v, ok, err := s2.GetMeta("node-id"); err != nil || !ok || string(v) != "n1" {
		t.Errorf("after reopen GetMeta = %q, %v, %v", v, ok, err)
	}
}

func TestOpenTwiceFails(t *testing.T) {
	dir := t.TempDir()
	open(t, dir)
	if s, err := Open(dir); err == nil {
		s.Close()
		t.Fatal("second Open of a held directory succeeded")
	}
}

func TestMetaIsSeparateFromRecords(t *testing.T) {
	s := open(t, t.TempDir())
	if _, ok, err := s.GetMeta("hlc"); ok || err != nil {
		t.Fatalf("GetMeta on empty store = %v, %v", ok, err)
	}
	// A meta key shaped like a record key must still stay out of List.
	for k, v := range map[string]string{"node-id": "n1", "svc/default/web": "meta", "empty": ""} {
		if err := s.PutMeta(k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutMeta("", []byte("x")); err == nil {
		t.Error("PutMeta with empty key succeeded")
	}
	drain(s)
	if err := s.PutMeta("node-id", []byte("n2")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Changed():
		t.Error("PutMeta signalled Changed")
	default:
	}
	if v, ok, err := s.GetMeta("node-id"); err != nil || !ok || string(v) != "n2" {
		t.Errorf("GetMeta(node-id) = %q, %v, %v", v, ok, err)
	}
	if v, ok, err := s.GetMeta("empty"); err != nil || !ok || v == nil || len(v) != 0 {
		t.Errorf("GetMeta(empty) = %#v, %v, %v; want empty non-nil", v, ok, err)
	}
	if rs, err := s.List(""); err != nil || len(rs) != 0 {
		t.Errorf("List sees meta: %v, %v", rs, err)
	}
	if _, ok, _ := s.Get("svc/default/web"); ok {
		t.Error("Get sees meta")
	}
	if m, err := s.Snapshot(); err != nil || len(m) != 0 {
		t.Errorf("Snapshot sees meta: %v, %v", m, err)
	}
}

func drain(s *Store) {
	select {
	case <-s.Changed():
	default:
	}
}

func TestChangedSignalsOnlyRealChanges(t *testing.T) {
	s := open(t, t.TempDir())
	r := rec("svc/default/web", 10, "n1", `1`)
	mustApply(t, s, r, true)
	mustApply(t, s, rec("svc/default/db", 10, "n1", `1`), true)
	// Two writes, coalesced into one signal.
	select {
	case <-s.Changed():
	default:
		t.Fatal("no signal after writes")
	}
	select {
	case <-s.Changed():
		t.Fatal("second signal: writes were not coalesced")
	default:
	}
	mustApply(t, s, r, false)
	mustApply(t, s, rec("svc/default/web", 9, "n1", `0`), false)
	select {
	case <-s.Changed():
		t.Fatal("signal after writes that changed nothing")
	default:
	}
}

// TestConcurrentApplyKeepsWinner races many writers on few keys; whatever the
// interleaving, each key must end with the greatest record written to it, and
// every Apply that reported a write must have been the winner at that time.
func TestConcurrentApplyKeepsWinner(t *testing.T) {
	s := open(t, t.TempDir())
	const writers, each = 6, 40
	keyNames := []string{"svc/default/a", "svc/default/b", "svc/default/c"}
	want := crdt.Map{}
	var wantMu sync.Mutex
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			clock := hlc.New(nil)
			origin := fmt.Sprintf("n%d", w)
			for i := range each {
				r := crdt.Record{
					Key:     keyNames[(w+i)%len(keyNames)],
					Value:   json.RawMessage(fmt.Sprintf(`{"w":%d,"i":%d}`, w, i)),
					Version: clock.Now(),
					Origin:  origin,
					Deleted: false,
				}
				if i%5 == 4 {
					r.Value, r.Deleted = nil, true
				}
				if _, err := s.Apply(r); err != nil {
					t.Errorf("writer %d: Apply: %v", w, err)
					return
				}
				wantMu.Lock()
				want.Apply(r)
				wantMu.Unlock()
			}
		})
	}
	// Batches racing the single writes.
	wg.Go(func() {
		clock := hlc.New(nil)
		for i := range 20 {
			var batch []crdt.Record
			for _, k := range keyNames {
				batch = append(batch, rec(k, clock.Now().Wall, "batcher", fmt.Sprintf(`{"batch":%d}`, i)))
			}
			if _, err := s.ApplyAll(batch); err != nil {
				t.Errorf("batcher: ApplyAll: %v", err)
				return
			}
			wantMu.Lock()
			for _, r := range batch {
				want.Apply(r)
			}
			wantMu.Unlock()
		}
	})
	wg.Wait()
	got, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keyNames {
		if !got[k].Equal(want[k]) {
			t.Errorf("%s = %+v, want winner %+v", k, got[k], want[k])
		}
	}
}

func TestCorruptValueErrorNamesKey(t *testing.T) {
	s := open(t, t.TempDir())
	good := rec("svc/default/good", 1, "n", `1`)
	mustApply(t, s, good, true)
	goodBytes, err := crdt.EncodeRecord(good)
	if err != nil {
		t.Fatal(err)
	}
	// Write damage straight into badger, as a torn disk block would.
	for k, v := range map[string][]byte{
		"svc/default/garbage": []byte("\x01\x00garbage"),
		"svc/default/moved":   goodBytes, // valid record stored under another key
	} {
		if err := s.db.Update(func(txn *badger.Txn) error { return txn.Set([]byte(recordPrefix+k), v) }); err != nil {
			t.Fatal(err)
		}
	}
	calls := map[string]func(key string) error{
		"Get":   func(k string) error { _, _, err := s.Get(k); return err },
		"Apply": func(k string) error { _, err := s.Apply(rec(k, 99, "n", `2`)); return err },
		"List":  func(k string) error { _, err := s.List(k); return err },
	}
	for _, key := range []string{"svc/default/garbage", "svc/default/moved"} {
		for name, call := range calls {
			err := call(key)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), key) {
				t.Errorf("%s(%s) error = %v, want ErrCorrupt naming the key", name, key, err)
			}
		}
	}
	if _, err := s.Snapshot(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Snapshot error = %v, want ErrCorrupt", err)
	}
	if _, err := s.Purge(time.Now(), 0); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Purge error = %v, want ErrCorrupt", err)
	}
	// Healthy keys stay readable.
	if got := mustGet(t, s, "svc/default/good"); !got.Equal(good) {
		t.Errorf("Get(good) = %+v", got)
	}
}

func TestDropRecordsKeepsMeta(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := crdt.Record{Key: "deployment/default/a", Value: []byte(`{}`), Version: hlc.Timestamp{Wall: 1}, Origin: "n1"}
	if _, err := s.Apply(r); err != nil {
		t.Fatal(err)
	}
	if err := s.PutMeta("name", []byte("n1")); err != nil {
		t.Fatal(err)
	}
	if err := s.DropRecords(); err != nil {
		t.Fatal(err)
	}
	if rs, err := s.List(""); err != nil || len(rs) != 0 {
		t.Fatalf("records after drop: %v %v", rs, err)
	}
	if v, ok, err := s.GetMeta("name"); err != nil || !ok || string(v) != "n1" {
		t.Fatalf("meta after drop: %q %v %v", v, ok, err)
	}
}
