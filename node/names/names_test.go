package names

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/dns"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/view"
)

// TestTheZoneInputIsTheViewsServices: a ClusterIP Service by its
// allocated address, a headless one by the ready replicas of its
// StatefulSet (by their names) on the nodes whose addresses count, an
// ExternalName one by its name; the pods of those nodes, ready or not,
// by their addresses (an address outside its node's subnet: none).
func TestTheZoneInputIsTheViewsServices(t *testing.T) {
	objs, err := manifest.Parse([]byte(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {selector: {app: web}, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec: {clusterIP: None, selector: {app: db}, ports: [{name: pg, port: 5432}]}
---
apiVersion: v1
kind: Service
metadata: {name: search, namespace: shop}
spec: {type: ExternalName, externalName: search.example.com}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: shop}
spec:
  serviceName: db
  replicas: 2
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: pg, image: postgres}]}
`), "shop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var svcs, workloads []manifest.Object
	for _, o := range objs {
		if o.Service != nil {
			svcs = append(svcs, o)
		} else {
			workloads = append(workloads, o)
		}
	}
	ready := func(name, ip string, ok bool) api.Replica {
		return api.Replica{Name: name, Namespace: "shop", Workload: "db", Phase: api.PhaseRunning, Ready: ok, PodIP: ip}
	}
	v := &view.View{Services: svcs, SvcIndex: view.NewServiceIndex(svcs, workloads),
		Alloc:   service.Allocation{ClusterIPs: map[string]netip.Addr{"shop/web": netip.MustParseAddr("10.96.0.20")}},
		Alive:   map[string]bool{"a": true, "b": true, "c": false},
		Winners: map[string]bool{"a": true, "b": true, "c": true},
		Statuses: map[string]view.NodeStatus{
			"a": {Name: "a", PodSubnet: "10.22.1.0/24", SubnetReady: true, Replicas: []api.Replica{ready("db-0", "10.22.1.5", true), ready("db-9", "10.22.9.5", true)}},
			"b": {Name: "b", PodSubnet: "10.22.2.0/24", SubnetReady: true, Replicas: []api.Replica{ready("db-1", "10.22.2.5", false)}},
			"c": {Name: "c", PodSubnet: "10.22.3.0/24", SubnetReady: true, Replicas: []api.Replica{ready("db-1", "10.22.3.5", true)}}, // dead
		}}
	z := dns.Build(InputOf(v, "cluster.local"))
	want := `10-22-1-5.shop.pod.cluster.local. 5 IN A 10.22.1.5
10-22-2-5.shop.pod.cluster.local. 5 IN A 10.22.2.5
20.0.96.10.in-addr.arpa. 5 IN PTR web.shop.svc.cluster.local.
5.1.22.10.in-addr.arpa. 5 IN PTR db-0.db.shop.svc.cluster.local.
5.2.22.10.in-addr.arpa. 5 IN PTR 10-22-2-5.shop.pod.cluster.local.
_http._tcp.web.shop.svc.cluster.local. 5 IN SRV 0 100 80 web.shop.svc.cluster.local.
_pg._tcp.db.shop.svc.cluster.local. 5 IN SRV 0 100 5432 db-0.db.shop.svc.cluster.local.
db-0.db.shop.svc.cluster.local. 5 IN A 10.22.1.5
db.shop.svc.cluster.local. 5 IN A 10.22.1.5
search.shop.svc.cluster.local. 5 IN CNAME search.example.com.
web.shop.svc.cluster.local. 5 IN A 10.96.0.20`
	if got := z.String(); got != want {
		t.Errorf("zone:\n%s\nwant:\n%s", got, want)
	}
}

// TestSearchesAreAPodsWithNdots5: the names a ClusterFirst pod's
// resolver asks, in order.
func TestSearchesAreAPodsWithNdots5(t *testing.T) {
	for name, want := range map[string]string{
		"hello":           "hello.shop.svc.cluster.local. hello.svc.cluster.local. hello.cluster.local. hello.",
		"www.example.com": "www.example.com.shop.svc.cluster.local. www.example.com.svc.cluster.local. www.example.com.cluster.local. www.example.com.",
		"a.b.c.d.e.f":     "a.b.c.d.e.f. a.b.c.d.e.f.shop.svc.cluster.local. a.b.c.d.e.f.svc.cluster.local. a.b.c.d.e.f.cluster.local.",
		"example.com.":    "example.com.",
	} {
		if got := strings.Join(Searches(name, "shop", "cluster.local"), " "); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
}

// fixedViews is one view, never changed.
type fixedViews struct{ v *view.View }

func (f fixedViews) View() *view.View         { return f.v }
func (f fixedViews) Changed() <-chan struct{} { return nil }

// TestLookupFromAReplicaAsksItsNode: a lookup from a replica of another
// node goes to that node (once, marked for it), whose answer must be
// its own for the namespace asked; one that reached the wrong node, or
// for a replica not here, is refused, never sent on; a replica of this
// node is looked up here.
func TestLookupFromAReplicaAsksItsNode(t *testing.T) {
	rep := func(name string, phase api.Phase) api.Replica {
		return api.Replica{Name: name, Namespace: "shop", Phase: phase, PodIP: "10.22.2.5"}
	}
	v := &view.View{Alive: map[string]bool{"a": true, "b": true, "c": false},
		Statuses: map[string]view.NodeStatus{
			"a": {Name: "a", Replicas: []api.Replica{rep("web-1", api.PhaseRunning), rep("old-0", api.PhaseTerminating)}},
			"b": {Name: "b", Replicas: []api.Replica{rep("web-2", api.PhaseRunning), rep("old-0", api.PhaseRunning)}},
			"c": {Name: "c", Replicas: []api.Replica{rep("web-3", api.PhaseRunning)}}, // dead
		}}
	for _, tc := range []struct {
		q        api.DNSQuery
		answerAs string // the node the peer says it is
		asked    string // the node asked, "" none
		want     string // the error, "" none
	}{
		{q: api.DNSQuery{From: "web-2"}, answerAs: "b", asked: "b"},
		{q: api.DNSQuery{From: "old-0"}, answerAs: "b", asked: "b"}, // handed over from a
		{q: api.DNSQuery{From: "web-2"}, answerAs: "c", asked: "b", want: `node b answered as node "c"`},
		{q: api.DNSQuery{From: "web-1"}, want: "no pod subnet"}, // here
		{q: api.DNSQuery{From: "web-3"}, want: "runs on no live node"},
		{q: api.DNSQuery{From: "nosuch"}, want: "runs on no live node"},
		{q: api.DNSQuery{From: "web-2", Node: "a"}, want: "does not run on node a"},
		{q: api.DNSQuery{From: "web-1", Node: "b"}, want: "a lookup for node b reached node a"},
	} {
		asked := ""
		s := &Supervisor{Self: "a", Domain: "cluster.local", Views: fixedViews{v},
			Peer: func(_ context.Context, node string, _ view.NodeStatus, q api.DNSQuery) (api.DNSAnswer, error) {
				if q.Node != node {
					t.Errorf("%+v: node %s asked with node %q", tc.q, node, q.Node)
				}
				asked = node
				return api.DNSAnswer{Node: tc.answerAs, Namespace: q.Namespace}, nil
			}}
		tc.q.Name, tc.q.Type, tc.q.Namespace = "hello", "A", "shop"
		_, err := s.Lookup(context.Background(), tc.q)
		if asked != tc.asked || (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: asked %q, %v; want asked %q, %q", tc.q, asked, err, tc.asked, tc.want)
		}
	}
}
