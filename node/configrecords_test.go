package node

import (
	"testing"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// TestArrivalCheckOfConfigurationRecords: a ConfigMap record must hold a
// valid ConfigMap of its key; a Secret record, whose data this check
// cannot open, a v1 Secret of its key with well-formed sealed data.
func TestArrivalCheckOfConfigurationRecords(t *testing.T) {
	cases := []struct {
		name string
		rec  crdt.Record
		want string
	}{
		{"Secret under another name", crdt.Record{Key: "secret/default/x", Origin: "b",
			Value: []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"y","namespace":"default"}}`)}, rejectObject},
		{"Secret with a broken seal", crdt.Record{Key: "secret/default/x", Origin: "b",
			Value: []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x","namespace":"default"},"sealedData":"AAAA"}`)}, rejectObject},
		{"Secret with a bad name", crdt.Record{Key: "secret/default/X..", Origin: "b",
			Value: []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"X..","namespace":"default"}}`)}, rejectObject},
		{"invalid ConfigMap", crdt.Record{Key: "configmap/default/c", Origin: "b",
			Value: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"default"},"data":{"a/b":"x"}}`)}, rejectObject},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rj := checkRecord(tc.rec, testClusterCIDR)
			if rj == nil || rj.reason != tc.want {
				t.Fatalf("got %v, want reason %q", rj, tc.want)
			}
		})
	}
	for _, ok := range []crdt.Record{
		{Key: "secret/default/x", Origin: "b", Value: []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x","namespace":"default"},"type":"Opaque","data":{"a":"eA=="}}`)},
		{Key: "configmap/default/c", Origin: "b", Value: []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"default"},"data":{"a":"x"}}`)},
		{Key: "secret/default/x", Origin: "b", Deleted: true},
	} {
		if rj := checkRecord(ok, testClusterCIDR); rj != nil {
			t.Errorf("%s refused: %v", ok.Key, rj)
		}
	}
}
