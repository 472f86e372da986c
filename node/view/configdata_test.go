package view

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

type memRecords map[string]crdt.Record

func (m memRecords) Get(k string) (crdt.Record, bool, error) { r, ok := m[k]; return r, ok, nil }
func (m memRecords) List(prefix string) ([]crdt.Record, error) {
	var out []crdt.Record
	for k, r := range m {
		if strings.HasPrefix(k, prefix) {
			out = append(out, r)
		}
	}
	return out, nil
}
func (memRecords) Changed() <-chan struct{} { return nil }
func (memRecords) Take() ([]string, bool)   { return nil, true }
func (memRecords) SetAll()                  {}

// flakyOpener fails to open until ok is set (a key that arrives later).
type flakyOpener struct{ ok bool }

func (f *flakyOpener) Open(_ string, v []byte) ([]byte, error) {
	if !f.ok {
		return nil, errors.New("sealed under a key this node does not hold")
	}
	return v, nil
}

// TestConfigThatDoesNotOpenIsRetried: a Secret that does not open is
// left out (its replicas wait), tried again every configRetryEvery, not
// on every build, taken once it opens, and forgotten once it leaves the
// store.
func TestConfigThatDoesNotOpenIsRetried(t *testing.T) {
	recs := memRecords{
		"configmap/ns/a": {Key: "configmap/ns/a", Value: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns"},"data":{"k":"v"}}`)},
		"secret/ns/s":    {Key: "secret/ns/s", Value: []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"ns"},"type":"Opaque","data":{"p":"eA=="}}`)},
	}
	op := &flakyOpener{}
	vs := NewBuilder(Config{Records: recs, Opener: op, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t0 := time.Unix(1e9, 0)
	v1 := &View{built: t0, Changes: everything}
	if err := vs.configInto(v1, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := v1.Config.ConfigMap("ns", "a"); !ok {
		t.Fatal("the ConfigMap is missing")
	}
	if _, ok := v1.Config.Secret("ns", "s"); ok {
		t.Fatal("a Secret that does not open is in the view")
	}
	op.ok = true
	v2 := &View{built: t0.Add(time.Second)}
	vs.configInto(v2, v1)
	if v2.Config != v1.Config {
		t.Fatal("decoded again on a build with no change before the retry is due")
	}
	v3 := &View{built: t0.Add(configRetryEvery + time.Second)}
	vs.configInto(v3, v2)
	if d, ok := v3.Config.Secret("ns", "s"); !ok || string(d["p"]) != "x" {
		t.Fatalf("the Secret that opens now is not taken: %v %v", d, ok)
	}
	op.ok = false
	delete(recs, "secret/ns/s")
	recs["secret/ns/t"] = crdt.Record{Key: "secret/ns/t", Value: recs["configmap/ns/a"].Value} // another that does not open
	v4 := &View{built: t0.Add(2 * configRetryEvery), Changes: Changes{Config: true}}
	vs.configInto(v4, v3)
	if _, held := vs.badConfig["secret/ns/s"]; held || len(vs.badConfig) != 1 {
		t.Fatalf("records that do not open: %v, want only secret/ns/t", vs.badConfig)
	}
}
