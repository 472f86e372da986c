package node

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/store"
	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/test/harness"
)

// Placement runs once per change of its inputs on each node, and only in
// the view's builder: an idle cluster computes none, API reads and status
// changes (replicas starting, becoming ready) compute none, and one
// Deployment applied makes each node compute exactly one.
func TestPlacementRunsOncePerChange(t *testing.T) {
	nodes := startCluster(t, 3)
	placements := func() []float64 {
		var out []float64
		for _, n := range nodes {
			out = append(out, testutil.ToFloat64(n.agent.metrics.placements))
		}
		return out
	}
	quiet := func() []float64 {
		t.Helper()
		// Settled: no placement for 3 s (membership and subnets are
		// still settling just after start).
		var last []float64
		waitFor(t, 20*time.Second, func() error {
			before := placements()
			time.Sleep(3 * time.Second)
			last = placements()
			if fmt.Sprint(before) != fmt.Sprint(last) {
				return fmt.Errorf("placements went from %v to %v", before, last)
			}
			return nil
		})
		return last
	}
	idle := quiet()
	for range 50 {
		for _, n := range nodes {
			n.agent.api.info.Replicas()
			call(t, n, "GET", "/v1/nodes", nil, nil)
			call(t, n, "GET", "/v1/objects/deployment", nil, nil)
		}
	}
	if got := placements(); fmt.Sprint(got) != fmt.Sprint(idle) {
		t.Fatalf("API reads computed placements: %v -> %v", idle, got)
	}
	deploy(t, nodes[0], "web", 6, "img:v1")
	waitFor(t, 20*time.Second, func() error { return runningEverywhere(nodes, "web", 6) })
	after := quiet()
	for i := range nodes {
		if after[i] != idle[i]+1 {
			t.Errorf("%s computed %v placements for one Deployment applied (and its 6 replicas started), want 1", nodes[i].name, after[i]-idle[i])
		}
	}
	ownedAsPlaced(t, nodes)
	// An annotation changes the object, not placement's inputs: placement
	// is kept, and what it gives each node is listed again from the new
	// objects.
	storeObjects(t, nodes[1], testDeployment(t, harness.App{Name: "web", Replicas: 6, Container: "c", Image: "img:v1"},
		func(d *appsv1.Deployment) { d.Annotations = map[string]string{"note": "changed"} }))
	waitFor(t, 20*time.Second, func() error {
		for _, n := range nodes {
			if v := n.agent.views.View(); !slices.ContainsFunc(v.Workloads, func(o manifest.Object) bool { return o.Deployment.Annotations["note"] == "changed" }) {
				return fmt.Errorf("%s has not the annotated Deployment", n.name)
			}
		}
		return nil
	})
	if got := quiet(); fmt.Sprint(got) != fmt.Sprint(after) {
		t.Errorf("an annotation computed placements: %v -> %v", after, got)
	}
	ownedAsPlaced(t, nodes)
}

// ownedAsPlaced checks that each node's view lists as its own (what a
// reconcile pass starts from) exactly what the view's placement gives it
// over the view's replicas, however many views reused it.
func ownedAsPlaced(t *testing.T, nodes []*testNode) {
	t.Helper()
	for _, n := range nodes {
		v := n.agent.views.View()
		if v.Own == nil || v.Own.Node != n.name {
			t.Fatalf("%s: the view holds no list of what placement gives it", n.name)
		}
		if want := view.OwnedBy(n.name, v.All, v.Owner); !reflect.DeepEqual(v.Own, want) {
			t.Fatalf("%s: the view says it owns %d replicas, placement over its replicas gives %d", n.name, len(v.Own.Replicas), len(want.Replicas))
		}
	}
}

// Under a stream of changes (every node's status records while a
// workload moves across a large cluster), the view is rebuilt at most
// every viewGap, not once per change: each rebuild, and each loop it
// wakes, costs O(nodes + replicas).
func TestViewRebuildsAreSpacedUnderAStreamOfChanges(t *testing.T) {
	n := start(t, "solo", t.TempDir(), nil)
	waitSubnetSettled(t, n, 20*time.Second)
	builds := func() float64 { return testutil.ToFloat64(n.agent.metrics.viewBuilds) }
	before, t0 := builds(), time.Now()
	// 100 records gossiped in, one every 30 ms (more than viewDebounce
	// apart, so each would otherwise make a rebuild of its own), as peers'
	// status records arrive: not API writes, which rebuild at once.
	for i := range 100 {
		rec := crdt.Record{Key: fmt.Sprintf("test/stream/%d", i), Value: []byte(`"x"`), Version: n.agent.clock.Now(), Origin: "solo"}
		if _, err := n.agent.store.Apply(rec); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
	}
	took := time.Since(t0)
	time.Sleep(2 * view.ViewGap)
	got := builds() - before
	limit := took.Seconds()/0.2 + 6 // viewGap: 200 ms (and a few rebuilds of the agent itself)
	t.Logf("100 records over %v: %v view builds (at most %.0f)", took.Round(time.Millisecond), got, limit)
	if got > limit {
		t.Fatalf("%v view builds for 100 records over %v, want at most %.0f (one per 200 ms)", got, took, limit)
	}
	if got < 2 {
		t.Fatalf("%v view builds for 100 records over %v: the view did not follow them", got, took)
	}
}

// countingStore counts the records its reads return.
type countingStore struct {
	Store
	gets, listed int
}

func (c *countingStore) Get(key string) (crdt.Record, bool, error) {
	c.gets++
	return c.Store.Get(key)
}

func (c *countingStore) List(prefix string) ([]crdt.Record, error) {
	rs, err := c.Store.List(prefix)
	c.listed += len(rs)
	return rs, err
}

// The statuses the view holds follow the store's writes, reading only
// the records that changed: a status record changed among 200 costs one
// read, not 200 (each node's view and subnet-claim check did that for
// every record received: O(N^2) per node in a forming cluster). A write,
// a delete and a purge all show.
func TestHeldStatusesReadOnlyChangedRecords(t *testing.T) {
	inner := &countingStore{Store: store.NewMemory()}
	st := track(inner)
	feed := new(view.ClaimsFeed)
	vs := view.NewBuilder(view.Config{Records: st, ClusterCIDR: testClusterCIDR, Log: newTextLogger(io.Discard),
		Membership: noMembers{}, Damping: noDamping{}, Acks: view.NewAckTracker(0), Claims: feed,
		ServiceCIDR: &net.IPNet{IP: net.IP(testServiceCIDR.Addr().AsSlice()), Mask: net.CIDRMask(testServiceCIDR.Bits(), 32)}})
	status := func(i, wall int) crdt.Record {
		s := goodStatus()
		s.Name, s.Replicas = fmt.Sprintf("n%03d", i), nil
		s.PodSubnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 22, byte(i), 0}), 24).String()
		r := statusRecord(t, s, s.Name)
		r.Version.Wall = int64(wall)
		return r
	}
	held := func() map[string]view.NodeStatus {
		vs.Rebuild(time.Now())
		out := map[string]view.NodeStatus{}
		feed.Load().Each(func(s view.NodeStatus) { out[s.Name] = s })
		return out
	}
	for i := range 200 {
		if _, err := st.Apply(status(i, 2)); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(held()); got != 200 {
		t.Fatalf("first look: %d statuses, want 200", got)
	}
	inner.gets, inner.listed = 0, 0
	changed := status(7, 3)
	var s view.NodeStatus
	json.Unmarshal(changed.Value, &s)
	s.SubnetReady = false
	changed.Value, _ = json.Marshal(s)
	if _, err := st.Apply(changed); err != nil {
		t.Fatal(err)
	}
	h := held()
	if h["n007"].SubnetReady || len(h) != 200 {
		t.Fatalf("the changed status does not show: %+v (%d held)", h["n007"], len(h))
	}
	if inner.gets != 1 || inner.listed != 0 {
		t.Fatalf("one changed record read %d records and listed %d, want 1 and 0", inner.gets, inner.listed)
	}
	if held(); inner.gets != 1 {
		t.Fatalf("no change read %d records", inner.gets-1)
	}
	del := status(9, 4)
	del.Deleted, del.Value = true, nil
	if _, err := st.Apply(del); err != nil {
		t.Fatal(err)
	}
	if _, ok := held()["n009"]; ok {
		t.Fatal("a deleted status is still held")
	}
	// A purge (or a drop) changes records the wrapper does not see one
	// by one: the next look reads them all again. (A record written
	// under the wrapper stands for what the purge may change.)
	if _, err := inner.Apply(status(250, 5)); err != nil {
		t.Fatal(err)
	}
	if _, ok := held()["n250"]; ok {
		t.Fatal("a record written under the tracked store was seen without a purge: the test shows nothing")
	}
	if n, err := st.Purge(time.Now().Add(time.Hour), time.Minute); err != nil || n == 0 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	if h := held(); len(h) != 200 || h["n250"].Name != "n250" {
		t.Fatalf("after a purge: %d held (n250 %v), want 200 with n250", len(h), h["n250"].Name != "")
	}
	// The claims near a subnet are those that overlap it, its own included.
	near := feed.Load().Near(view.NodeStatus{Name: "x", PodSubnet: "10.22.7.0/24"})
	if len(near) != 1 || near[0].Name != "n007" {
		t.Fatalf("claims near 10.22.7.0/24: %v", near)
	}
}

// noMembers is an empty membership, noDamping a node with no peers that
// holds the cluster's state: a view builder's inputs in tests of what it
// reads from the store.
type noMembers struct{}

func (noMembers) Members() []gossip.Member { return nil }
func (noMembers) Changed() <-chan struct{} { return nil }

type noDamping struct{}

func (noDamping) AliveAfter(time.Time, []gossip.Member, *view.Alive) (view.Alive, bool) {
	return view.Alive{Set: map[string]bool{}}, false
}
func (noDamping) IsSynced() bool { return true }

// A change of what placement reads of a node (its labels here) reaches
// the view's eligible nodes, and one that does not (its replica list)
// keeps them: the view keeps the claims' winners and the eligible nodes
// only while no held status changed them.
func TestViewFollowsANodesPlacementFields(t *testing.T) {
	nodes := startCluster(t, 2)
	a := nodes[0].agent
	eligible := func() map[string]string {
		out := map[string]string{}
		for _, n := range a.views.View().Eligible {
			out[n.Name] = n.Labels["zone"]
		}
		return out
	}
	waitFor(t, 20*time.Second, func() error {
		if e := eligible(); len(e) != 2 {
			return fmt.Errorf("eligible %v", e)
		}
		return nil
	})
	// n2's record as a newer write would carry it (the store under the
	// view takes it as gossip's Accept hook passed it).
	rewrite := func(change func(*view.NodeStatus)) {
		t.Helper()
		rec, ok, err := a.store.Get(view.StatusKey(nodes[1].name))
		if err != nil || !ok {
			t.Fatalf("n2's record: %v %v", ok, err)
		}
		var s view.NodeStatus
		if err := json.Unmarshal(rec.Value, &s); err != nil {
			t.Fatal(err)
		}
		change(&s)
		rec.Value, _ = json.Marshal(s)
		rec.Version = a.clock.Now()
		if _, err := a.store.Apply(rec); err != nil {
			t.Fatal(err)
		}
		a.views.Rebuild(time.Now())
	}
	before := a.views.View()
	rewrite(func(s *view.NodeStatus) { s.Replicas = nil })
	if after := a.views.View(); len(after.Statuses[nodes[1].name].Replicas) != 0 || &after.Eligible[0] != &before.Eligible[0] {
		t.Fatalf("a replica list change: n2 lists %d replicas (want 0), eligible nodes kept: %v; want the status changed and the eligible nodes kept",
			len(after.Statuses[nodes[1].name].Replicas), &after.Eligible[0] == &before.Eligible[0])
	}
	rewrite(func(s *view.NodeStatus) { s.Labels = map[string]string{"zone": "moved"} })
	if got := eligible()[nodes[1].name]; got != "moved" {
		t.Fatalf("n2's new label not in the view's eligible nodes: zone %q", got)
	}
}
