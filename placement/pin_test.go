package placement

import (
	"strings"
	"testing"
	"time"
)

// TestPinnedReplicasGoToTheirNodeOrNowhere: a replica whose data lives
// on a node (Workload.Pinned) is placed there even past the node's load
// bound, stays Pending naming the node while the node is not among the
// nodes (never placed elsewhere with empty data), is not kept on
// another node that runs a copy, and moves nothing else.
func TestPinnedReplicasGoToTheirNodeOrNowhere(t *testing.T) {
	nodes := []Node{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	free := Workload{Key: "ns/web", Replicas: 6}
	db := Workload{Key: "ns/db", Replicas: 3, Pinned: map[int]string{0: "c", 1: "c", 2: "c"}}
	p := Assign(nodes, []Workload{free, db}, Options{})
	for ord, o := range p.Owners["ns/db"] {
		if o != "c" {
			t.Fatalf("pinned ordinal %d on %q, want c", ord, o)
		}
	}
	if len(p.Pending) != 0 {
		t.Fatalf("pending: %v", p.Pending)
	}
	// The unpinned replicas are placed as they would be with the pinned
	// ones' load on c.
	for _, o := range p.Owners["ns/web"] {
		if o == "" {
			t.Fatalf("web replica unplaced: %v", p.Owners["ns/web"])
		}
	}

	// c is gone: the pinned replicas wait for it, naming it.
	p = Assign(nodes[:2], []Workload{free, db}, Options{})
	for ord, o := range p.Owners["ns/db"] {
		if o != "" {
			t.Fatalf("pinned ordinal %d placed on %s while its node is gone", ord, o)
		}
		if why := p.Pending["ns/db"][ord]; !strings.Contains(why, "node c") {
			t.Fatalf("pending reason %q does not name node c", why)
		}
	}
	// A copy that runs on a, kept by Keep for any other replica, is not
	// kept for a pinned one.
	kept := Keep(p, nodes[:2], []Workload{free, db}, []Holder{{Key: "ns/db", Ordinal: 0, Node: "a", Since: time.Unix(1, 0), Running: true}}, Options{})
	if o := kept.Owner("ns/db", 0); o != "" {
		t.Fatalf("a copy on a kept the pinned replica: owner %q", o)
	}

	// Resources still bound a pinned replica; the selector too.
	small := []Node{{Name: "a"}, {Name: "c", Allocatable: Resources{MilliCPU: 500}, Labels: map[string]string{"disk": "ssd"}}}
	big := Workload{Key: "ns/big", Replicas: 2, Requests: Resources{MilliCPU: 300}, Pinned: map[int]string{0: "c", 1: "c"}}
	p = Assign(small, []Workload{big}, Options{})
	if p.Owner("ns/big", 0) != "c" || p.Owner("ns/big", 1) != "" || !strings.Contains(p.Pending["ns/big"][1], "node c") {
		t.Fatalf("want ordinal 0 on c and 1 pending on c's cpu: %v %v", p.Owners, p.Pending)
	}
	sel := Workload{Key: "ns/sel", Replicas: 1, NodeSelector: map[string]string{"disk": "hdd"}, Pinned: map[int]string{0: "c"}}
	if p = Assign(small, []Workload{sel}, Options{}); p.Owner("ns/sel", 0) != "" || !strings.Contains(p.Pending["ns/sel"][0], "nodeSelector") {
		t.Fatalf("a pin to a node the selector rules out: %v %v", p.Owners, p.Pending)
	}
	// A pin to an ordinal the workload does not have is ignored.
	if p = Assign(nodes, []Workload{{Key: "ns/x", Replicas: 1, Pinned: map[int]string{5: "a"}}}, Options{}); p.Owner("ns/x", 0) == "" {
		t.Fatal("an out-of-range pin left the replica unplaced")
	}
}
