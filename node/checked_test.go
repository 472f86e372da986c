package node

import (
	"io"
	"testing"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/view"
)

// A status record or desired object the arrival check accepts is noted,
// decoded, for the view (view.Checked, which the view takes instead of
// decoding the record again); a status it refuses is not.
func TestArrivalCheckHandsTheViewItsDecoding(t *testing.T) {
	x := newRejects(testClusterCIDR, nil, noBindings, noRevocations, noOwner, newTextLogger(io.Discard), newMetrics().rejectedRecords)
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
