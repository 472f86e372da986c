package view

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// The Services' ports as the view computes them: by Service, each
// recomputed only when what it is made of changed (its Service, the
// workloads it selects, their ready endpoints), and the keys of the
// Services whose ports changed handed to the services loop, which gives
// only those to the rule syncer (service.Syncer.SyncServices).

// serviceIndex is what the Services' ports are computed from that
// changes only with the desired objects: the workloads each Service's
// selector matches (by Service key), and the Services that select each
// workload (by workload key). Built once per change of the objects:
// O(Services x workloads of their namespace).
type serviceIndex struct {
	byKey     map[string]manifest.Object
	Matches   map[string][]manifest.Object
	selectors map[string][]string
}

func NewServiceIndex(svcs, workloads []manifest.Object) serviceIndex {
	idx := serviceIndex{byKey: map[string]manifest.Object{}, Matches: map[string][]manifest.Object{}, selectors: map[string][]string{}}
	byNS := map[string][]manifest.Object{}
	for _, d := range workloads {
		byNS[d.Namespace] = append(byNS[d.Namespace], d)
	}
	for _, o := range svcs {
		key := o.Namespace + "/" + o.Name
		idx.byKey[key] = o
		if len(o.Service.Spec.Selector) == 0 {
			continue
		}
		sel := labels.SelectorFromSet(o.Service.Spec.Selector)
		for _, d := range byNS[o.Namespace] {
			if sel.Matches(labels.Set(d.PodTemplate().Labels)) {
				idx.Matches[key] = append(idx.Matches[key], d)
				w := reconcile.WorkloadKey(d.Namespace, d.Name)
				idx.selectors[w] = append(idx.selectors[w], key)
			}
		}
	}
	return idx
}

// ServicePortsOf is the dataplane input of Service o: each of its ports
// if it has an allocated ClusterIP, with as endpoints the ready addresses
// of the workloads its selector matches (matches), at the resolved
// target port.
func ServicePortsOf(o manifest.Object, alloc service.Allocation, matches []manifest.Object, ready map[string][]netip.Addr) []service.Port {
	key := o.Namespace + "/" + o.Name
	ip, ok := alloc.ClusterIPs[key]
	if !ok {
		return nil
	}
	var ports []service.Port
	for _, sp := range o.Service.Spec.Ports {
		p := service.Port{Service: key, Name: sp.Name, Protocol: service.Protocol(sp.Protocol), ClusterIP: ip, Port: uint16(sp.Port),
			NodePort: uint16(alloc.NodePorts[key+"/"+sp.Name]), LoadBalancer: alloc.LoadBalancers[key], Local: externalLocal(o)}
		for _, d := range matches {
			target, ok := TargetPort(sp, d)
			if !ok || target <= 0 || target > 65535 {
				continue
			}
			for _, podIP := range ready[reconcile.WorkloadKey(d.Namespace, d.Name)] {
				p.Endpoints = append(p.Endpoints, netip.AddrPortFrom(podIP, uint16(target)))
			}
		}
		ports = append(ports, p)
	}
	return ports
}

// TargetPort resolves a Service port's targetPort against a workload's
// containers: a number is used as is, a name must be a port name of an
// app container or a sidecar (as Kubernetes' FindPort).
func TargetPort(sp corev1.ServicePort, d manifest.Object) (int32, bool) {
	if sp.TargetPort.Type == 0 { // intstr.Int
		if sp.TargetPort.IntVal == 0 {
			return sp.Port, true
		}
		return sp.TargetPort.IntVal, true
	}
	t := d.PodTemplate()
	for _, c := range t.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == sp.TargetPort.StrVal && cp.Protocol == sp.Protocol {
				return cp.ContainerPort, true
			}
		}
	}
	for _, c := range t.Spec.InitContainers {
		for _, cp := range c.Ports {
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways && cp.Name == sp.TargetPort.StrVal && cp.Protocol == sp.Protocol {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

// ServicesInto sets v's ports by Service from prev's and the builder's
// endpoint index (which it brings up to v's statuses): after a change of
// the desired objects every Service's ports are computed again;
// otherwise only those of the Services that select a workload whose
// ready endpoints changed, at a cost that follows the change (the nodes
// whose record or standing changed, the workloads they run, the
// Services selecting those) plus one look at each node. The keys of the
// Services whose ports differ from prev's are kept in v (SvcChanged,
// svcAll), noted for the services loop when v is stored (Builder.Set).
// Called with build held, for each view derived.
func (vs *Builder) ServicesInto(v, prev *View) {
	changedW := vs.endpoints.Update(v)
	if prev == nil || prev.SvcPorts == nil || v.Changes.Objects || v.lbChanged {
		ports := map[string][]service.Port{}
		for _, o := range v.Services {
			key := o.Namespace + "/" + o.Name
			if ps := ServicePortsOf(o, v.Alloc, v.SvcIndex.Matches[key], vs.endpoints.Ready); len(ps) > 0 {
				ports[key] = ps
			}
		}
		v.SvcPorts = newPortShards(ports)
		if prev == nil || prev.SvcPorts == nil {
			v.svcAll = true
			return
		}
		var changed []string
		for key, ps := range ports {
			if !SamePorts(ps, prev.SvcPorts.Get(key)) {
				changed = append(changed, key)
			}
		}
		prev.SvcPorts.each(func(key string, _ []service.Port) {
			if _, ok := ports[key]; !ok {
				changed = append(changed, key)
			}
		})
		v.SvcChanged = changed
		return
	}
	v.SvcPorts = prev.SvcPorts
	var affected []string
	for _, w := range changedW {
		affected = append(affected, v.SvcIndex.selectors[w]...)
	}
	if len(affected) == 0 {
		return
	}
	slices.Sort(affected)
	next := map[string][]service.Port{}
	for _, key := range slices.Compact(affected) {
		ps := ServicePortsOf(v.SvcIndex.byKey[key], v.Alloc, v.SvcIndex.Matches[key], vs.endpoints.Ready)
		if !SamePorts(ps, prev.SvcPorts.Get(key)) {
			next[key] = ps
		}
	}
	v.SvcPorts = prev.SvcPorts.with(next)
	v.SvcChanged = slices.Collect(maps.Keys(next))
}

// EndpointIndex is the view builder's index of ready endpoints, kept up
// to date with the views it derives (update): what each node contributes
// and, by workload, the sorted addresses of every node's contribution.
type EndpointIndex struct {
	nodes map[string]nodeEndpoints
	Ready map[string][]netip.Addr
}

// nodeEndpoints is one node's contribution and what it was computed
// from: its standing (alive, winning its claim, subnet ready), its
// subnet and the version of the status record that listed its replicas
// (NodeStatus.Version: a node writes a new version for each change of
// its record; zero for a status no record carries yet, such as this
// node's own before it is held, which is read on every update).
type nodeEndpoints struct {
	eligible bool
	subnet   string
	version  hlc.Timestamp
	eps      []workloadAddr // sorted (NodeReady)
}

// workloadAddr is one ready endpoint: its workload (WorkloadKey) and
// address. A node's are a sorted slice, not a map by workload: a map
// per node came to 1 KB each, 1 MB a view at 1,000 nodes.
type workloadAddr struct {
	Workload string
	Ip       netip.Addr
}

func (a workloadAddr) compare(b workloadAddr) int {
	return cmp.Or(strings.Compare(a.Workload, b.Workload), a.Ip.Compare(b.Ip))
}

// Update brings the index to v's statuses and standing and returns the
// workloads whose ready endpoints changed. Each node is looked at once;
// only those whose record or standing changed are read, and a changed
// workload's list is rebuilt from what they withdrew and added.
func (e *EndpointIndex) Update(v *View) (changed []string) {
	if e.nodes == nil {
		e.nodes, e.Ready = map[string]nodeEndpoints{}, map[string][]netip.Addr{}
	}
	gone, added := map[string][]netip.Addr{}, map[string][]netip.Addr{}
	diff := func(old, now []workloadAddr) {
		for i, j := 0, 0; i < len(old) || j < len(now); {
			switch {
			case j == len(now) || i < len(old) && old[i].compare(now[j]) < 0:
				gone[old[i].Workload] = append(gone[old[i].Workload], old[i].Ip)
				i++
			case i == len(old) || old[i].compare(now[j]) > 0:
				added[now[j].Workload] = append(added[now[j].Workload], now[j].Ip)
				j++
			default:
				i, j = i+1, j+1
			}
		}
	}
	for name, s := range v.Statuses {
		eligible := v.Alive[name] && v.Winners[name] && s.SubnetReady
		old, ok := e.nodes[name]
		stale := v.Stale[name]
		if stale && !(ok && old.eligible) {
			// A record an earlier run of the node wrote adds no endpoint:
			// back from a crash, its pods died with it. What an agent
			// restart found in rules stays (its pods run on, as when the
			// kubelet restarts) until its new record says otherwise.
			eligible = false
		}
		if ok && old.eligible == eligible && old.subnet == s.PodSubnet && old.version == s.Version && !s.Version.IsZero() {
			continue
		}
		now := nodeEndpoints{eligible: eligible, subnet: s.PodSubnet, version: s.Version}
		if eligible {
			now.eps = NodeReady(s)
			if stale {
				// A later record of the earlier run (written before
				// that run ended, arrived after) withdraws, never adds.
				now.eps = common(old.eps, now.eps)
			}
		}
		diff(old.eps, now.eps)
		e.nodes[name] = now
	}
	for name, old := range e.nodes {
		if _, ok := v.Statuses[name]; !ok {
			diff(old.eps, nil)
			delete(e.nodes, name)
		}
	}
	for w := range gone {
		changed = append(changed, w)
	}
	for w := range added {
		if _, ok := gone[w]; !ok {
			changed = append(changed, w)
		}
	}
	slices.Sort(changed)
	for _, w := range changed {
		cur, out := e.Ready[w], []netip.Addr(nil)
		minus := gone[w]
		slices.SortFunc(minus, netip.Addr.Compare)
		for i, j := 0, 0; i < len(cur); i++ { // cur less minus, as multisets
			for j < len(minus) && minus[j].Less(cur[i]) {
				j++
			}
			if j < len(minus) && minus[j] == cur[i] {
				j++
				continue
			}
			out = append(out, cur[i])
		}
		out = append(out, added[w]...)
		slices.SortFunc(out, netip.Addr.Compare)
		if len(out) == 0 {
			delete(e.Ready, w)
		} else {
			e.Ready[w] = out
		}
	}
	return changed
}

// NodeReady is what status s contributes to the ready endpoints: the
// addresses of its ready, running replicas inside its subnet, with their
// workload, sorted.
func NodeReady(s NodeStatus) []workloadAddr {
	subnet, err := netip.ParsePrefix(s.PodSubnet)
	if err != nil {
		return nil
	}
	var out []workloadAddr
	for _, r := range s.Replicas {
		if !r.Ready || r.Phase != api.PhaseRunning {
			continue
		}
		ip, err := netip.ParseAddr(r.PodIP)
		if err != nil || !subnet.Contains(ip) {
			continue
		}
		out = append(out, workloadAddr{reconcile.WorkloadKey(r.Namespace, r.Workload), ip})
	}
	slices.SortFunc(out, workloadAddr.compare)
	return out
}

// common returns the addresses in both a and b (each sorted by
// workloadAddr.compare), in that order.
func common(a, b []workloadAddr) []workloadAddr {
	var out []workloadAddr
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch c := a[i].compare(b[j]); {
		case c < 0:
			i++
		case c > 0:
			j++
		default:
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	return out
}

// SamePorts reports whether a and b are the same ports with the same
// endpoints in the same order.
func SamePorts(a, b []service.Port) bool {
	return slices.EqualFunc(a, b, func(x, y service.Port) bool {
		return x.Service == y.Service && x.Name == y.Name && x.Protocol == y.Protocol && x.ClusterIP == y.ClusterIP &&
			x.Port == y.Port && x.NodePort == y.NodePort && x.LoadBalancer == y.LoadBalancer && x.Local == y.Local && slices.Equal(x.Endpoints, y.Endpoints)
	})
}
