package node

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand"
	"net"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/dataplane"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/test/harness"
)

// readyEndpoints (the reference the view's endpoint index is checked
// against) returns the addresses of the ready, running replicas of
// live nodes, by workload ("namespace/name"), each list sorted. A node's
// replicas count only when its subnet claim is the winning one for its
// subnet and has settled, and only addresses inside that subnet are
// taken: a node cannot make another node's pods, or any other address,
// endpoints of a Service.
func readyEndpoints(alive map[string]bool, statuses map[string]view.NodeStatus, winners map[string]bool) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for name, s := range statuses {
		if !alive[name] || !winners[name] || !s.SubnetReady {
			continue
		}
		for _, a := range view.NodeReady(s) {
			out[a.Workload] = append(out[a.Workload], a.Ip)
		}
	}
	for _, ips := range out {
		slices.SortFunc(ips, netip.Addr.Compare)
	}
	return out
}

// servicePorts (the reference the view's ports are checked against)
// builds the dataplane input of every Service (a Service
// without an allocated ClusterIP has none).
func servicePorts(svcs []manifest.Object, alloc service.Allocation, workloads []manifest.Object, ready map[string][]netip.Addr) []service.Port {
	idx := view.NewServiceIndex(svcs, workloads)
	var ports []service.Port
	for _, o := range svcs {
		ports = append(ports, view.ServicePortsOf(o, alloc, idx.Matches[o.Namespace+"/"+o.Name], ready)...)
	}
	return ports
}

// appDeployment is Deployment name of replicas, its pods labelled
// app=name, with a container port named http (8080).
func appDeployment(t testing.TB, name string, replicas int) manifest.Object {
	return testDeployment(t, harness.App{Name: name, Replicas: int32(replicas), Container: "c", Image: "x", Ports: harness.HTTPPort})
}

// webService is Service name selecting app=workload, its port web port
// forwarding to target.
func webService(t testing.TB, name, workload string, port int32, target string) manifest.Object {
	return testService(t, harness.App{Name: workload}, name, []corev1.ServicePort{namedPort("web", port, target)})
}

// The services loop gives the rule syncer only the Services the views
// noted as changed. Over random changes of replicas, node liveness and
// the desired objects, a model fed only those (Model.UpdateServices, as
// service.Syncer.SyncServices does) stays equal to one fed every port
// computed from scratch, and no Service is noted whose ports did not
// change.
func TestViewNotesTheServicesWhosePortsChanged(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	svcNet := &net.IPNet{IP: net.IP(testServiceCIDR.Addr().AsSlice()), Mask: net.CIDRMask(testServiceCIDR.Bits(), 32)}
	objects := func(port int) (svcs, workloads []manifest.Object) {
		for w := 0; w < 10; w++ {
			workloads = append(workloads, appDeployment(t, fmt.Sprintf("w%d", w), 1))
		}
		for s := 0; s < 30; s++ {
			p := 80
			if s == 0 {
				p = port // the object change: Service s0's port
			}
			svcs = append(svcs, webService(t, fmt.Sprintf("s%02d", s), fmt.Sprintf("w%d", s%10), int32(p), "http"))
		}
		return svcs, workloads
	}
	names := []string{"a", "b", "c", "d", "e"}
	statuses := map[string]view.NodeStatus{}
	for i, n := range names {
		statuses[n] = view.NodeStatus{Name: n, PodSubnet: fmt.Sprintf("10.22.%d.0/24", i+1), SubnetReady: true}
	}
	alive := map[string]bool{"a": true, "b": true, "c": true, "d": true, "e": true}
	vs := view.NewBuilder(view.Config{})
	var prev *view.View
	var model, full service.Model
	cfg := service.Config{ClusterCIDR: testClusterCIDR}
	port := 80
	for step := 0; step < 300; step++ {
		what := rng.Intn(10)
		objectsChanged := prev == nil
		switch {
		case step > 0 && what == 0: // an object change
			port, objectsChanged = 80+rng.Intn(3), true
		case what == 1: // a node dies or returns
			n := names[rng.Intn(len(names))]
			alive[n] = !alive[n]
		default: // one node's replicas change
			i := rng.Intn(len(names))
			s := statuses[names[i]]
			s.Replicas = nil
			for r := rng.Intn(4); r > 0; r-- {
				s.Replicas = append(s.Replicas, api.Replica{Name: fmt.Sprintf("r%d", r), Namespace: "default", Workload: fmt.Sprintf("w%d", rng.Intn(10)),
					Phase: api.PhaseRunning, Ready: rng.Intn(4) > 0, PodIP: fmt.Sprintf("10.22.%d.%d", i+1, 2+rng.Intn(5))})
			}
			s.Version = hlc.Timestamp{Wall: int64(step + 1)} // a new record
			statuses[names[i]] = s
		}
		v := &view.View{Alive: maps.Clone(alive), Statuses: maps.Clone(statuses), Winners: alive,
			Changes: view.Changes{Objects: objectsChanged, Statuses: true}}
		if !v.Changes.Objects {
			v.Services, v.Workloads, v.Alloc, v.SvcIndex = prev.Services, prev.Workloads, prev.Alloc, prev.SvcIndex
		} else {
			v.Services, v.Workloads = objects(port)
			v.Alloc = service.Allocate(view.ServiceSpecs(v.Services), svcNet)
			v.SvcIndex = view.NewServiceIndex(v.Services, v.Workloads)
		}
		vs.ServicesInto(v, prev)
		vs.Set(v)
		want := servicePorts(v.Services, v.Alloc, v.Workloads, readyEndpoints(v.Alive, v.Statuses, v.Winners))
		if got := v.AllPorts(); !view.SamePorts(got, want) {
			t.Fatalf("step %d: the view's ports\n%+v\nwant\n%+v", step, got, want)
		}
		keys, all := vs.TakeServiceChanges()
		if all {
			model.Update(v.AllPorts(), cfg)
		} else {
			svcs := map[string][]service.Port{}
			for _, k := range keys {
				svcs[k] = v.SvcPorts.Get(k)
			}
			model.UpdateServices(svcs, cfg)
		}
		full.Update(want, cfg)
		if !view.SamePorts(model.Ports(), full.Ports()) {
			t.Fatalf("step %d: fed the noted Services %v, the model holds\n%+v\nwant\n%+v", step, keys, model.Ports(), full.Ports())
		}
		if prev != nil {
			for _, k := range keys {
				if view.SamePorts(v.SvcPorts.Get(k), prev.SvcPorts.Get(k)) {
					t.Fatalf("step %d: %s noted with unchanged ports", step, k)
				}
			}
		}
		prev = v
	}
	if !slices.ContainsFunc(full.Ports(), func(p service.Port) bool { return len(p.Endpoints) > 0 }) {
		t.Fatal("no port ever had an endpoint: the test shows nothing")
	}
}

// BenchmarkViewServices measures what the view spends on the Services'
// ports when one replica of one node becomes ready or unready, with n
// Services each selecting its own Deployment of 3 replicas, on n/10
// nodes of 30 replicas each: the changed node's contribution read again,
// the Services of its changed workload recomputed, the shard of the
// ports holding them copied, and one look at each node (the only part
// that grows: with the nodes, not the Services).
func BenchmarkViewServices(b *testing.B) {
	svcNet := &net.IPNet{IP: net.IP(testServiceCIDR.Addr().AsSlice()), Mask: net.CIDRMask(testServiceCIDR.Bits(), 32)}
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("%d", n), func(b *testing.B) {
			nodes := n / 10
			v := &view.View{Alive: map[string]bool{}, Statuses: map[string]view.NodeStatus{}, Winners: map[string]bool{}, Changes: view.Changes{Objects: true}}
			for w := 0; w < n; w++ {
				v.Workloads = append(v.Workloads, appDeployment(b, fmt.Sprintf("w%d", w), 3))
				v.Services = append(v.Services, webService(b, fmt.Sprintf("s%d", w), fmt.Sprintf("w%d", w), 80, "8080"))
			}
			v.Alloc = service.Allocate(view.ServiceSpecs(v.Services), svcNet)
			v.SvcIndex = view.NewServiceIndex(v.Services, v.Workloads)
			for i := 0; i < nodes; i++ {
				name := fmt.Sprintf("n%d", i)
				v.Alive[name], v.Winners[name] = true, true
				v.Statuses[name] = view.NodeStatus{Name: name, PodSubnet: fmt.Sprintf("10.%d.%d.0/24", 22+i/256, i%256), SubnetReady: true}
			}
			for w := 0; w < n; w++ {
				for r := 0; r < 3; r++ {
					i := (w*3 + r) % nodes
					s := v.Statuses[fmt.Sprintf("n%d", i)]
					s.Replicas = append(s.Replicas, api.Replica{Name: fmt.Sprintf("w%d-%d", w, r), Namespace: "default", Workload: fmt.Sprintf("w%d", w),
						Phase: api.PhaseRunning, Ready: true, PodIP: fmt.Sprintf("10.%d.%d.%d", 22+i/256, i%256, 2+len(s.Replicas))})
					v.Statuses[s.Name] = s
				}
			}
			vs := view.NewBuilder(view.Config{})
			vs.ServicesInto(v, nil)
			// Two views that differ in one replica's readiness, taken in
			// turn.
			views := [2]*view.View{v, nil}
			next := *v
			next.Statuses = maps.Clone(v.Statuses)
			s := next.Statuses["n7"]
			s.Replicas = slices.Clone(s.Replicas)
			s.Replicas[0].Ready = false
			next.Statuses["n7"] = s
			views[1] = &next
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				cur, prev := *views[(i+1)%2], views[i%2]
				vs.ServicesInto(&cur, prev)
				if len(cur.SvcChanged) != 1 {
					b.Fatalf("changed %v, want one Service", cur.SvcChanged)
				}
				views[(i+1)%2] = &cur
			}
		})
	}
}

// modelSyncer is a rule syncer that keeps a service.Model, as
// service.Syncer does, without a kernel.
type modelSyncer struct{ m service.Model }

func (s *modelSyncer) Sync(_ context.Context, ports []service.Port, cfg service.Config) (bool, error) {
	return !s.m.Update(ports, cfg).Empty(), nil
}

func (s *modelSyncer) SyncServices(_ context.Context, changed map[string][]service.Port, _ func() []service.Port, cfg service.Config) (bool, error) {
	return !s.m.UpdateServices(changed, cfg).Empty(), nil
}

// A services pass that runs while a view is derived but not yet stored
// does not lose that view's changed Services: the next pass, which its
// storing wakes, syncs them (they were taken by the pass in between, read
// against the older view, and never synced again).
func TestServicesPassBetweenDeriveAndStoreLosesNothing(t *testing.T) {
	svcNet := &net.IPNet{IP: net.IP(testServiceCIDR.Addr().AsSlice()), Mask: net.CIDRMask(testServiceCIDR.Bits(), 32)}
	svc := mustParse(t, goodServiceYAML)
	dep := mustParse(t, goodDeploymentYAML)
	vs := view.NewBuilder(view.Config{})
	rules := &modelSyncer{}
	sv := dataplane.NewServices(dataplane.ServicesConfig{Views: vs, ClusterCIDR: testClusterCIDR, Rules: rules, BridgeNF: func() bool { return true }, Log: newTextLogger(io.Discard)})
	build := func(prev *view.View, ready bool) *view.View {
		s := goodStatus()
		s.Replicas[0].Ready = ready
		v := &view.View{Alive: map[string]bool{"b": true}, Winners: map[string]bool{"b": true}, Statuses: map[string]view.NodeStatus{"b": s}, Changes: view.Changes{Objects: prev == nil},
			Services: []manifest.Object{svc}, Workloads: []manifest.Object{dep}}
		v.Alloc = service.Allocate(view.ServiceSpecs(v.Services), svcNet)
		v.SvcIndex = view.NewServiceIndex(v.Services, v.Workloads)
		vs.ServicesInto(v, prev)
		return v
	}
	endpoints := func() int {
		n := 0
		for _, p := range rules.m.Ports() {
			n += len(p.Endpoints)
		}
		return n
	}
	v1 := build(nil, false)
	vs.Set(v1)
	sv.Sync(context.Background())
	if rules.m.Len() == 0 || endpoints() != 0 {
		t.Fatalf("first view: %d ports, %d endpoints; want the Service's ports without endpoints", rules.m.Len(), endpoints())
	}
	v2 := build(v1, true)         // the replica is ready: one endpoint per port
	sv.Sync(context.Background()) // a pass before v2 is stored
	vs.Set(v2)
	sv.Sync(context.Background()) // the pass v2's storing wakes
	if got, want := endpoints(), rules.m.Len(); got != want {
		t.Fatalf("after the ready replica's view: %d endpoints in the rules, want %d (one per port)", got, want)
	}
}

// A record an earlier run of a node wrote adds no endpoint: a node back
// from a crash is held with the record it published before, whose ready
// pods died with it, until its record of the new run arrives. An agent
// restart (the node never counted as down) keeps the endpoints it had in
// rules: its pods run on.
func TestStaleRecordsAddNoEndpointAndWithdrawNone(t *testing.T) {
	rec := func(ip string) view.NodeStatus {
		return view.NodeStatus{Name: "b", PodSubnet: "10.64.2.0/24", SubnetReady: true, Replicas: []api.Replica{
			{Namespace: "default", Workload: "web", Name: "web-1", Phase: api.PhaseRunning, Ready: true, PodIP: ip}}}
	}
	viewOf := func(alive, stale bool, s view.NodeStatus) *view.View {
		return &view.View{Statuses: map[string]view.NodeStatus{"b": s}, Alive: map[string]bool{"b": alive}, Stale: map[string]bool{"b": stale},
			Winners: map[string]bool{"b": true}}
	}
	const w = "default/web"
	old := rec("10.64.2.7")

	// Back from a crash: down, then alive with its old record.
	var e view.EndpointIndex
	e.Update(viewOf(true, false, old))
	e.Update(viewOf(false, false, old))
	if len(e.Ready[w]) != 0 {
		t.Fatalf("a down node's endpoints: %v", e.Ready[w])
	}
	if changed := e.Update(viewOf(true, true, old)); len(changed) != 0 || len(e.Ready[w]) != 0 {
		t.Fatalf("the record of its earlier run added endpoints %v (changed %v)", e.Ready[w], changed)
	}
	if e.Update(viewOf(true, false, rec("10.64.2.9"))); len(e.Ready[w]) != 1 || e.Ready[w][0].String() != "10.64.2.9" {
		t.Fatalf("its record of the new run: endpoints %v, want 10.64.2.9", e.Ready[w])
	}

	// An agent restart: alive all along, a new run named before its record.
	var r view.EndpointIndex
	r.Update(viewOf(true, false, old))
	if changed := r.Update(viewOf(true, true, old)); len(changed) != 0 || len(r.Ready[w]) != 1 {
		t.Fatalf("an agent restart withdrew endpoints: %v (changed %v)", r.Ready[w], changed)
	}
	// A later record of the earlier run (it arrived after the restart)
	// withdraws what it no longer lists ready and adds nothing.
	later := old
	later.Replicas = append(slices.Clone(old.Replicas), api.Replica{Namespace: "default", Workload: "web", Name: "web-2", Phase: api.PhaseRunning, Ready: true, PodIP: "10.64.2.8"})
	if r.Update(viewOf(true, true, later)); len(r.Ready[w]) != 1 || r.Ready[w][0].String() != "10.64.2.7" {
		t.Fatalf("a later record of the earlier run: endpoints %v, want only 10.64.2.7", r.Ready[w])
	}
	if r.Update(viewOf(true, true, rec("10.64.2.8"))); len(r.Ready[w]) != 0 {
		t.Fatalf("a later record of the earlier run that lists 10.64.2.7 no more: endpoints %v, want none", r.Ready[w])
	}
}
