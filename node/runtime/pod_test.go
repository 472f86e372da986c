package runtime

import (
	"testing"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

func TestGroupMembersPutsEachUnderItsReplica(t *testing.T) {
	all := []reconcile.Container{{ID: "ns_a.init"}, {ID: "ns_a"}, {ID: "ns_b.log"}, {ID: "ns_c"}}
	memberOf := map[string]string{"ns_a.init": "ns_a", "ns_b.log": "ns_b"}
	got := groupMembers(all, memberOf)
	if len(got) != 3 || got[0].ID != "ns_a" || len(got[0].Members) != 1 || got[0].Members[0].ID != "ns_a.init" {
		t.Fatalf("grouped: %+v", got)
	}
	// A member whose replica container is gone stays alone, for Plan to
	// remove.
	if got[1].ID != "ns_c" || got[2].ID != "ns_b.log" {
		t.Errorf("grouped: %+v, want ns_c, then the lone member ns_b.log", got)
	}
}
