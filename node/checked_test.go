package node

import (
	"crypto/ed25519"
	"io"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/view"
)

// A status record or desired object the arrival check accepts is noted,
// decoded, for the view (view.Checked, which the view takes instead of
// decoding the record again); a status it refuses is not.
func TestArrivalCheckHandsTheViewItsDecoding(t *testing.T) {
	x := newRejects(testClusterCIDR, nil, fakeIDs{}, nil, 0, nil, newTextLogger(io.Discard), newMetrics().rejectedRecords)
	good := signAs(t, "b", statusRecord(t, goodStatus(), "b"))
	if err := x.check(good); err != nil {
		t.Fatalf("good record refused: %v", err)
	}
	bad := signAs(t, "b", statusRecord(t, func() view.NodeStatus { s := goodStatus(); s.PodSubnet, s.Replicas = "8.8.8.0/24", nil; return s }(), "b"))
	if x.check(bad) == nil {
		t.Fatal("a status outside the cluster CIDR was accepted")
	}
	if !x.checked.Holds(good) {
		t.Error("the accepted status record's decoding was not noted for the view")
	}
	if x.checked.Holds(bad) {
		t.Error("a refused status record's decoding was noted")
	}
	dep := signAs(t, "b", crdt.Record{Key: "deployment/default/web", Value: mustEncode(t, goodDeploymentYAML), Version: good.Version, Origin: "b"})
	if err := x.check(dep); err != nil {
		t.Fatalf("good Deployment refused: %v", err)
	}
	if !x.checked.Holds(dep) {
		t.Error("the accepted Deployment's decoding was not noted for the view")
	}
}

// Only a record every check accepts is noted: a copy of a node's status
// re-signed by another key (refused: the name is bound to the first key)
// or a record from too far ahead of the clock is not, and does not
// replace the decoding of the record the node accepted. Before, the
// status was noted before the signature was checked, and the view took
// a decoding that matched the forged copy (the match ignored the signer).
func TestArrivalCheckNotesOnlyWhatItAccepts(t *testing.T) {
	bound := func(name string) ([]byte, bool) {
		if name == "b" {
			return keyOf("b").Public().(ed25519.PublicKey), true
		}
		return nil, false
	}
	x := newRejects(testClusterCIDR, nil, fakeIDs{bound: bound}, nil, 0, nil, newTextLogger(io.Discard), newMetrics().rejectedRecords)
	unsigned := statusRecord(t, goodStatus(), "b")
	good := signAs(t, "b", unsigned)
	if err := x.check(good); err != nil {
		t.Fatalf("good record refused: %v", err)
	}
	forged := signAs(t, "mallory", unsigned)
	if x.check(forged) == nil {
		t.Fatal("a copy signed by another key than the name's was accepted")
	}
	if x.checked.Holds(forged) {
		t.Error("the decoding of a copy refused for its signer was noted")
	}
	if !x.checked.Holds(good) {
		t.Error("a refused copy replaced the accepted record's decoding")
	}
	ahead := unsigned
	ahead.Version.Wall = time.Now().Add(2 * hlc.MaxOffset).UnixNano()
	ahead = signAs(t, "b", ahead)
	if x.check(ahead) == nil {
		t.Fatal("a record two hours ahead of the clock was accepted")
	}
	if x.checked.Holds(ahead) || !x.checked.Holds(good) {
		t.Error("a record refused for its time was noted, or replaced the accepted one")
	}
}
