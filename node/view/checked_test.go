package view

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/test/harness"
)

// A status record checked on arrival is decoded there once: the view
// takes that decoding (Config.Checked) instead of decoding the record
// again, only for the very record noted (another version or value is
// decoded as before), and the noted entry is used once.
func TestViewTakesTheStatusDecodedOnArrival(t *testing.T) {
	cluster := netip.MustParsePrefix("10.22.0.0/16")
	b, err := json.Marshal(NodeStatus{Name: "n1", PodSubnet: "10.22.1.0/24", Advertise: "as-stored"})
	if err != nil {
		t.Fatal(err)
	}
	r := crdt.Record{Key: StatusKey("n1"), Value: b, Version: hlc.Timestamp{Wall: 1e18}, Origin: "n1"}
	checked := NewChecked()
	vs := NewBuilder(Config{ClusterCIDR: cluster, Checked: checked})

	// What the arrival check decoded: told apart from the record's own
	// bytes by its address, so a second decoding would show.
	checked.Note(r, NodeStatus{Name: "n1", PodSubnet: "10.22.1.0/24", Advertise: "checked"}, cluster)
	if c := vs.decodeStatus(r); !c.ok || c.status.Advertise != "checked" || !c.status.subnet.IsValid() {
		t.Fatalf("the view decoded the record again, or lost the subnet: %+v", c)
	}
	if _, ok := checked.take(r); ok {
		t.Fatal("the noted decoding is kept after the view took it")
	}

	// A newer version, noted under the same key, is not taken for this
	// one: the view decodes what it holds.
	newer := r
	newer.Version.Wall++
	checked.Note(newer, NodeStatus{Name: "n1", PodSubnet: "10.22.1.0/24", Advertise: "newer"}, cluster)
	vs2 := NewBuilder(Config{ClusterCIDR: cluster, Checked: checked})
	if c := vs2.decodeStatus(r); !c.ok || c.status.Advertise != "as-stored" {
		t.Fatalf("a noted newer version was taken for an older record: %+v", c)
	}
	// And an older one noted after a newer one is not kept.
	checked.Note(r, NodeStatus{Name: "n1", Advertise: "older"}, cluster)
	if c, ok := checked.take(newer); !ok || c.status.Advertise != "newer" {
		t.Fatalf("an older note replaced a newer one: %+v %v", c, ok)
	}
}

// The same for a desired object: the view takes the object the arrival
// check decoded for the very record it holds, and decodes any other.
func TestViewTakesTheObjectDecodedOnArrival(t *testing.T) {
	o := mustParse(t, harness.App{Name: "web", Replicas: 1, Container: "c", Image: "img:v1"}.Deployment())
	b, err := manifest.Encode(o)
	if err != nil {
		t.Fatal(err)
	}
	r := crdt.Record{Key: o.Key(), Value: b, Version: hlc.Timestamp{Wall: 1e18}, Origin: "n1"}
	checked := NewChecked()
	vs := NewBuilder(Config{Checked: checked})
	// Told apart from the record's own bytes by its image.
	noted := mustParse(t, harness.App{Name: "web", Replicas: 1, Container: "c", Image: "img:noted"}.Deployment())
	checked.NoteObject(r, noted)
	got := vs.DecodeObjects([]crdt.Record{r}, map[string]bool{})
	if len(got) != 1 || got[0].Deployment.Spec.Template.Spec.Containers[0].Image != "img:noted" {
		t.Fatalf("the view decoded the record again: %+v", got)
	}
	other := r
	other.Version.Wall++
	checked.NoteObject(r, noted)
	vs2 := NewBuilder(Config{Checked: checked})
	if got := vs2.DecodeObjects([]crdt.Record{other}, map[string]bool{}); len(got) != 1 || got[0].Deployment.Spec.Template.Spec.Containers[0].Image != "img:v1" {
		t.Fatalf("an object noted for another version was taken: %+v", got)
	}
}
