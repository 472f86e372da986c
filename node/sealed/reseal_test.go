package sealed

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
)

type memRecords map[string]crdt.Record

func (m memRecords) List(prefix string) ([]crdt.Record, error) {
	var out []crdt.Record
	for _, r := range m {
		out = append(out, r)
	}
	return out, nil
}

func (m memRecords) PublishDurable(recs ...crdt.Record) error {
	for _, r := range recs {
		m[r.Key] = r
	}
	return nil
}

// TestResealLeavesNoSecretUnderARemovedKey: the rotation's reseal step
// writes every Secret sealed under the old key anew under the one in
// use (newer versions, so they win everywhere), and leaves alone those
// already under it; the old key removed, every Secret still opens.
func TestResealLeavesNoSecretUnderARemovedKey(t *testing.T) {
	ring := &keyring{key(1)}
	box := New(ring)
	recs := memRecords{}
	clock := hlc.New(time.Now)
	for _, name := range []string{"a", "b"} {
		k := "secret/default/" + name
		v, err := box.Seal(k, []byte(`{"kind":"Secret","apiVersion":"v1","metadata":{"name":"`+name+`","namespace":"default"},"data":{"k":"eA=="},"type":"Opaque"}`))
		if err != nil {
			t.Fatal(err)
		}
		recs[k] = crdt.Record{Key: k, Value: v, Version: clock.Now(), Origin: "n1"}
	}
	r := &Resealer{Box: New(ring), Records: recs, Writer: recs, Clock: clock, Self: "n2", Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if n, err := r.Reseal(context.Background()); n != 0 || err != nil {
		t.Fatalf("nothing to reseal under the key in use: %d %v", n, err)
	}
	old := recs["secret/default/a"]
	*ring = keyring{key(2), key(1)} // the new key in use, the old still held
	if n, err := r.Reseal(context.Background()); n != 2 || err != nil {
		t.Fatalf("reseal: %d %v", n, err)
	}
	if got := recs["secret/default/a"]; got.Version.Compare(old.Version) <= 0 || got.Origin != "n2" {
		t.Fatalf("the new record does not win: %+v", got)
	}
	*ring = keyring{key(2)}
	for k, rec := range recs {
		if _, err := box.Open(k, rec.Value); err != nil {
			t.Errorf("%s after the old key's removal: %v", k, err)
		}
	}
	if n, _ := r.Reseal(context.Background()); n != 0 {
		t.Fatalf("resealed %d again", n)
	}
}
