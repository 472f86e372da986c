package node

import (
	"encoding/json"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/view"
)

// TestSignaturesBindANameToOneKey: unsigned records and bad signatures are
// refused; once a name is bound to a key (its status record is held),
// records under that name signed by another key are refused, whatever
// they say, and the bound key is still accepted.
func TestSignaturesBindANameToOneKey(t *testing.T) {
	held := map[string][]byte{}
	bound := func(name string) ([]byte, bool) { k, ok := held[name]; return k, ok }
	m := newMetrics()
	revokedKeys := map[string]bool{}
	owner := func(k []byte) (string, bool) {
		for name, key := range held {
			if string(key) == string(k) {
				return name, true
			}
		}
		return "", false
	}
	claims := new(view.ClaimsFeed) // the membership: b alive or dead (setAlive)
	setAlive := func(name string, up bool) {
		state := gossip.StateDead
		if up {
			state = gossip.StateAlive
		}
		claims.Store(view.NewClaims(nil, []gossip.Member{{Name: name, State: state}}))
	}
	setAlive("b", false)
	x := newRejects(testClusterCIDR, nil, fakeIDs{bound: bound, revoked: func(k []byte) bool { return revokedKeys[string(k)] }, owner: owner}, claims, 0, nil, newTextLogger(io.Discard), m.rejectedRecords)
	good := statusRecord(t, goodStatus(), "b")
	reason := func(r crdt.Record) string {
		err := x.check(r)
		if err == nil {
			return ""
		}
		return err.(*rejection).reason
	}
	if got := reason(good); got != rejectUnsigned {
		t.Fatalf("unsigned: %q", got)
	}
	first := signAs(t, "b", good)
	if got := reason(first); got != "" {
		t.Fatalf("first status of b: %q", got)
	}
	held["b"] = first.Signer
	tampered := first
	tampered.Value = []byte(strings.Replace(string(first.Value), "10.22.2.5", "10.22.2.6", 1))
	if got := reason(tampered); got != rejectSignature {
		t.Fatalf("tampered: %q", got)
	}
	forged := signAs(t, "evil", good) // claims to be b, signed by evil's key
	if got := reason(forged); got != rejectIdentity {
		t.Fatalf("status of b signed by another key: %q", got)
	}
	svc := signAs(t, "evil", crdt.Record{Key: "deployment/default/web", Origin: "b", Value: mustEncode(t, goodDeploymentYAML), Version: hlc.Timestamp{Wall: 3}})
	if got := reason(svc); got != rejectIdentity {
		t.Fatalf("desired state under b's name signed by another key: %q", got)
	}
	later := good
	later.Version.Wall = 9
	if got := reason(signAs(t, "b", later)); got != "" {
		t.Fatalf("b's own next status: %q", got)
	}
	if got := counterValue(t, m, "starling_rejected_records_total", rejectIdentity); got != 2 {
		t.Fatalf("identity refusals counted %v, want 2", got)
	}
	// Unbinding b: a delete of its record by another node is refused
	// while b's key is not revoked; a revocation of a live node's key is
	// refused, under its own name or another; revocations are never
	// deleted. Once b is down, a revocation is accepted, then the delete.
	tomb := signAs(t, "a", crdt.Record{Key: view.StatusKey("b"), Origin: "a", Deleted: true, Version: hlc.Timestamp{Wall: 10}})
	if got := reason(tomb); got != rejectIdentity {
		t.Fatalf("delete of b's record without a revocation: %q", got)
	}
	revoke := func(name string, key []byte) crdt.Record {
		v, _ := json.Marshal(trust.Revocation{Name: name, Key: key})
		return signAs(t, "a", crdt.Record{Key: trust.RevokedKey(key), Value: v, Origin: "a", Version: hlc.Timestamp{Wall: 10}})
	}
	setAlive("b", true)
	if got := reason(revoke("b", first.Signer)); got != rejectRevoked {
		t.Fatalf("revocation of live b: %q", got)
	}
	if got := reason(revoke("nobody", first.Signer)); got != rejectRevoked {
		t.Fatalf("revocation of live b's key under another name: %q", got)
	}
	if got := reason(signAs(t, "a", crdt.Record{Key: trust.RevokedKey(first.Signer), Origin: "a", Deleted: true, Version: hlc.Timestamp{Wall: 10}})); got != rejectRevoked {
		t.Fatalf("delete of a revocation: %q", got)
	}
	setAlive("b", false)
	if got := reason(revoke("b", first.Signer)); got != "" {
		t.Fatalf("revocation of b, down: %q", got)
	}
	revokedKeys[string(first.Signer)] = true
	if got := reason(tomb); got != "" {
		t.Fatalf("delete of b's record once its key is revoked: %q", got)
	}
	// Forgotten: the name is free and b's key revoked. b's old key cannot
	// bind it again; a new key can.
	delete(held, "b")
	again := good
	again.Version.Wall = 11
	if got := reason(signAs(t, "b", again)); got != rejectRevoked {
		t.Fatalf("the forgotten key again: %q", got)
	}
	if got := reason(signAs(t, "b-new-key", again)); got != "" {
		t.Fatalf("a new identity for the freed name: %q", got)
	}
}

// TestTakeoverOfASettledSubnetIsRefused: a new claim that would beat a
// live node's settled claim (an earlier time, as a backdating writer
// says) is refused; a claim that loses anyway, one against an unsettled
// or dead node's claim, and the claim a node already held pass.
func TestTakeoverOfASettledSubnetIsRefused(t *testing.T) {
	n2 := goodStatus()
	n2.Name, n2.PodSubnet, n2.SubnetSince, n2.SubnetReady = "n2", "10.22.2.0/24", hlc.Timestamp{Wall: 100}, true
	held := map[string]view.NodeStatus{"n2": n2}
	live := func(name string) bool { return name != "dead" } // reserved: live, or down for less than --subnet-reclaim-after
	claim := func(subnet string, wall int64) view.NodeStatus {
		s := goodStatus()
		s.Name, s.PodSubnet, s.SubnetSince = "evil", subnet, hlc.Timestamp{Wall: wall}
		return s
	}
	for _, tc := range []struct {
		name    string
		s       view.NodeStatus
		held    map[string]view.NodeStatus
		refused bool
	}{
		{"backdated claim of a settled /24", claim("10.22.2.0/24", 1), held, true},
		{"backdated /28 inside it", claim("10.22.2.16/28", 1), held, true},
		{"a later claim (loses anyway)", claim("10.22.2.0/24", 200), held, false},
		{"another subnet", claim("10.22.3.0/24", 1), held, false},
		{"against an unsettled claim", claim("10.22.2.0/24", 1), map[string]view.NodeStatus{"n2": func() view.NodeStatus { s := n2; s.SubnetReady = false; return s }()}, false},
		{"against a claim no longer reserved", claim("10.22.2.0/24", 1), map[string]view.NodeStatus{"dead": func() view.NodeStatus { s := n2; s.Name = "dead"; return s }()}, false},
	} {
		rj := checkTakeover(tc.s, slices.Collect(maps.Values(tc.held)), live)
		if (rj != nil) != tc.refused || rj != nil && rj.reason != rejectSubnetTaken {
			t.Errorf("%s: %v, refused want %v", tc.name, rj, tc.refused)
		}
	}
	// Through the Accept hook: the claim a node already holds passes (a
	// node coming back), a changed one is checked.
	back := claim("10.22.2.0/24", 1)
	claims := new(view.ClaimsFeed)
	claims.Store(view.NewClaims(map[string]view.NodeStatus{"n2": n2, "evil": back},
		[]gossip.Member{{Name: "evil", State: gossip.StateAlive}, {Name: "n2", State: gossip.StateAlive}}))
	x := newRejects(testClusterCIDR, nil, fakeIDs{}, claims, time.Hour, nil, newTextLogger(io.Discard), newMetrics().rejectedRecords)
	rec := func(s view.NodeStatus) crdt.Record {
		for i := range s.Replicas {
			s.Replicas[i].Node = s.Name
			s.Replicas[i].PodIP = ""
		}
		return signAs(t, s.Name, statusRecord(t, s, s.Name))
	}
	if err := x.check(rec(back)); err != nil {
		t.Fatalf("the claim already held was refused: %v", err)
	}
	if err := x.check(rec(claim("10.22.2.0/24", 2))); err == nil || !strings.Contains(err.Error(), "subnet-taken") {
		t.Fatalf("a changed backdated claim: %v", err)
	}
	// A claim dated far ahead in a record written (version 2) before
	// n2's claim (100): stored, it reads as claimed at its write
	// (view.CapTimes), which beats n2's, so it is judged as that on arrival.
	if err := x.check(rec(claim("10.22.2.0/24", 1<<62))); err == nil || !strings.Contains(err.Error(), "subnet-taken") {
		t.Fatalf("a claim dated after its record's write, in a record older than the settled claim: %v", err)
	}
}

// TestClaimOfADownNodeStaysReservedUntilReclaim: a down node's settled
// claim is protected from takeover (checkTakeover) as long as ipam keeps
// it reserved: --subnet-reclaim-after after its last write.
func TestClaimOfADownNodeStaysReservedUntilReclaim(t *testing.T) {
	at := func(ago time.Duration) crdt.Record {
		return crdt.Record{Version: hlc.Timestamp{Wall: time.Now().Add(-ago).UnixNano()}}
	}
	for _, tc := range []struct {
		state gossip.MemberState
		ago   time.Duration
		want  bool
	}{
		{"alive", 48 * time.Hour, true},
		{"suspect", 48 * time.Hour, true},
		{"dead", time.Hour, true},
		{"left", time.Hour, true},
		{"dead", 25 * time.Hour, false},
		{"", 25 * time.Hour, false},
	} {
		if got := view.Reserved(tc.state, at(tc.ago).Version, 24*time.Hour); got != tc.want {
			t.Errorf("%s, last write %s ago: reserved = %v, want %v", tc.state, tc.ago, got, tc.want)
		}
	}
}
