package node

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/view"
)

// failAndReturn crashes 1 % of the nodes (at least one: a power cut, no
// leave, containers gone), measures detection and failover, brings them
// back after 30 s (same names, addresses and stores) and measures their
// return: the time until every replica has one owner again, and the
// bytes the cluster sent over its idle traffic (idleBytes per node per
// second) in the first minute.
func (c *simCluster) failAndReturn(rng *rand.Rand, report func(string, ...any), label string, replicas int, idle figures) {
	n := len(c.nodes)
	fail := max(1, n/100)
	var failed []*simNode
	for _, i := range rng.Perm(n)[:fail] {
		failed = append(failed, c.nodes[i])
	}
	for _, f := range failed {
		c.crash(f)
	}
	detected, ok := wait(5*time.Minute, 100*time.Millisecond, func() bool {
		for _, o := range c.up() {
			for _, f := range failed {
				if m, known := o.agent.mem.cluster.Member(f.name); known && m.State.Up() {
					return false
				}
			}
		}
		return true
	})
	took, ok2 := wait(5*time.Minute, 100*time.Millisecond, func() bool { return c.singleOwners(replicas) })
	if !ok2 {
		c.explainOwners(report, replicas)
	}
	report("%s: %d nodes failed: every node saw them dead %v after the cut (ok %v); every replica has exactly one owner %v after that (ok %v)",
		label, fail, detected.Round(time.Millisecond), ok, took.Round(time.Millisecond), ok2)
	if !ok || !ok2 {
		c.t.Errorf("%s: after %d nodes failed, detected %v, every replica with one owner %v", label, fail, ok, ok2)
	}
	time.Sleep(30 * time.Second)
	s0, w0, k0, by0, pubs0 := c.sent(), c.statusWrites(), c.streamKinds(), c.writesBy(), c.pubs.counts()
	pk0 := c.packetKinds()
	// The streams of the return are those with a returning node at one
	// end: the stayers' own push/pulls come in bursts (memberlist
	// staggers them over its base interval, then ticks every node at the
	// scaled one: at 300 nodes all 300 within 30 s every 150 s), so a
	// minute of them is anywhere from 0 to 17 MB.
	toReturners := func() (b int64) {
		for _, o := range c.nodes {
			if slices.Contains(failed, o) {
				continue // counted as the returners' own
			}
			for _, f := range failed {
				b += o.tr.StreamBytesTo(f.tr.Addr())
			}
		}
		return b
	}
	with0 := toReturners()
	olds := map[*simNode]string{}
	for _, f := range failed {
		if rec, ok, _ := c.up()[0].store.Get(view.StatusKey(f.name)); ok {
			olds[f] = rec.Version.String()
		}
	}
	back := time.Now()
	created0 := map[*simNode]int{}
	for _, f := range failed {
		f.rt.mu.Lock()
		created0[f] = f.rt.created
		f.rt.mu.Unlock()
		c.startNode(f, []string{c.up()[0].tr.Addr()})
	}
	var firstStarts sync.WaitGroup
	for _, f := range failed {
		firstStarts.Add(1)
		go func() {
			defer firstStarts.Done()
			c.firstStart(report, label, f, created0[f], back)
		}()
		firstStarts.Add(1)
		go func() {
			defer firstStarts.Done()
			report("%s: %s's return reached its peers: %s", label, f.name, c.returnArrival(f, olds[f], back, 30*time.Second))
		}()
	}
	took, ok = wait(5*time.Minute, 100*time.Millisecond, func() bool {
		for _, o := range c.nodes {
			if o.agent.mem.cluster.NumMembers() != n {
				return false
			}
		}
		return c.singleOwners(replicas)
	})
	if !ok {
		c.explainOwners(report, replicas)
		c.t.Errorf("%s: after %d nodes returned, the replicas do not each run exactly once after %v", label, fail, took)
	}
	time.Sleep(time.Minute - time.Since(back))
	firstStarts.Wait()
	s1, w1 := c.sent(), c.statusWrites()
	// What the returning nodes started, and what they run a minute
	// later: a copy started and stopped again is two records of the
	// returning node and one or two of the node that kept the replica.
	var started []string
	for _, f := range failed {
		f.rt.mu.Lock()
		started = append(started, fmt.Sprintf("%s started %d, runs %d", f.name, f.rt.created-created0[f], len(f.rt.containers)))
		f.rt.mu.Unlock()
	}
	report("%s: the returning nodes' first minute: %s", label, strings.Join(started, "; "))
	// The size of a node record as a stayer holds it (a returning
	// node's, with its replicas back), and its size compressed as
	// streams carry it.
	var recBytes, recZ int
	if rec, ok, _ := c.up()[0].store.Get(view.StatusKey(failed[0].name)); ok {
		recBytes, recZ = len(rec.Value), len(s2.Encode(nil, rec.Value))
	}
	// Who published: the returning nodes, and the stayers that did.
	var returners, stayers, busiest float64
	publishers := 0
	for name, w := range c.writesBy() {
		d := w - by0[name]
		if slices.ContainsFunc(failed, func(f *simNode) bool { return f.name == name }) {
			returners += d
			continue
		}
		if d > 0 {
			stayers += d
			publishers++
			busiest = max(busiest, d)
		}
	}
	// What the returns cost: the packets over the idle cluster's steady
	// packet traffic, plus the streams with a returning node at one end
	// (what they sent, and what the others sent them). Every stream of
	// the minute gives an upper bound.
	packets := float64(s1.PacketBytes-s0.PacketBytes) - idle.packetBytesPerNode*float64(n)*time.Minute.Seconds()
	streams := float64(s1.StreamBytes - s0.StreamBytes)
	extra := packets + streams
	with := float64(toReturners() - with0)
	for _, f := range failed {
		with += float64(f.tr.Counters().StreamBytes) // a new transport: this minute's
	}
	// User-message streams among the stayers are the return's too when
	// replicas move back (the stayers' node records, pulled over
	// streams): those over the idle rate count, which counts the user
	// messages with the returning nodes twice (a bound a little high).
	users := float64(c.kindBytesSince(k0, userMessageStream)) - idle.userStreamBytesPerNode*float64(n)*time.Minute.Seconds()
	cost := packets + max(users, 0) + with
	report("%s: %d nodes returned: every replica has exactly one owner again %v later (ok %v); the returns cost the cluster %.2f MB in their first minute (%.2f MB per returning node): %.2f MB of packets over idle, %.2f MB of user-message streams over idle and %.2f MB on streams with the returning nodes; all streams of the minute, the stayers' own included: %.2f MB on %d connections [%s] (at most %.2f MB with them); %.0f node records published (%.0f by the returning nodes, %.0f by %d stayers, at most %.0f by one); a returning node's record is %d bytes (%d compressed)",
		label, fail, took.Round(time.Millisecond), ok, cost/1e6, cost/1e6/float64(fail), packets/1e6, max(users, 0)/1e6, with/1e6,
		streams/1e6, s1.Streams-s0.Streams, c.streamKindsSince(k0), extra/1e6, w1-w0, returners, stayers, publishers, busiest, recBytes, recZ)
	report("%s: the node records of the returns' first minute by what changed in their replicas: %s", label, c.pubs.since(pubs0))
	report("%s: the packets of the returns' first minute by kind, over idle: %s", label, packetsOverIdle(c.packetKindsSince(pk0), idle))
}

// firstStart reports, when returning node f first starts a container
// (within 30 s of back), what its view held then: whether it had synced,
// and how many of the replicas it runs its view lists as running on an
// eligible node (a stale view lists none).
func (c *simCluster) firstStart(report func(string, ...any), label string, f *simNode, created0 int, back time.Time) {
	for time.Since(back) < 30*time.Second {
		f.rt.mu.Lock()
		started := f.rt.created > created0
		var ids []string
		for id := range f.rt.containers {
			ids = append(ids, id)
		}
		f.rt.mu.Unlock()
		if !started {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		v := f.agent.views.View()
		eligible := map[string]bool{}
		for _, e := range v.Eligible {
			eligible[e.Name] = true
		}
		elsewhere := 0
		for name, st := range v.Statuses {
			if name == f.name || !eligible[name] {
				continue
			}
			for _, r := range st.Replicas {
				if r.Phase == "Running" && slices.ContainsFunc(ids, func(id string) bool { return strings.HasSuffix(id, "_"+r.Name) }) {
					elsewhere++
				}
			}
		}
		report("%s: %s started its first container %v after its return (synced %v); its view then: %d eligible nodes, %d held copies away from placement, %d of the %d replicas it runs listed Running elsewhere",
			label, f.name, time.Since(back).Round(time.Millisecond), f.agent.mem.members.IsSynced(), len(v.Eligible), len(v.Away), elsewhere, len(ids))
		return
	}
}

// explainOwners reports why singleOwners does not hold.
func (c *simCluster) explainOwners(report func(string, ...any), want int) {
	seen := map[string][]string{}
	for _, n := range c.up() {
		n.rt.mu.Lock()
		for id, ct := range n.rt.containers {
			if ct.State == reconcile.StateRunning && strings.HasPrefix(ct.Workload, "sim-") {
				seen[id] = append(seen[id], n.name)
			}
		}
		n.rt.mu.Unlock()
	}
	dups := 0
	for id, on := range seen {
		if len(on) > 1 {
			if dups < 3 {
				var views []string
				for _, name := range on {
					for _, n := range c.up() {
						if n.name == name {
							v := n.agent.views.View()
							views = append(views, fmt.Sprintf("%s places it on %q (base %q, %d workloads placed, %d alive, excluded %v)",
								name, v.Owner.Of(id), view.Owners(v.All, v.Placement).Of(id), len(v.Placement.Owners), len(v.Alive), v.Excluded))
						}
					}
				}
				report("  %s runs on %v: %s", id, on, strings.Join(views, "; "))
			}
			dups++
		}
	}
	v := c.up()[0].agent.views.View()
	missing := 0
	for _, d := range v.All {
		if _, ok := seen[d.Id]; !ok {
			if missing < 3 {
				report("  %s (desired) runs nowhere; placed on %q", d.Id, v.Owner.Of(d.Id))
			}
			missing++
		}
	}
	report("  %d replicas running, want %d: %d on two nodes or more, %d desired and running nowhere", len(seen), want, dups, missing)
	for name := range v.Excluded {
		for _, n := range c.up() {
			if n.name != name {
				continue
			}
			own, _, _ := n.store.Get(view.StatusKey(name))
			held, _, _ := c.up()[0].store.Get(view.StatusKey(name))
			report("  %s's check of %s's record: %v", c.up()[0].name, name, c.up()[0].agent.guard.rejects.check(own))
			report("  excluded %s: its record %v (%d bytes), held by %s at %v; it lists %d replicas, placement gives it %d", name, own.Version, len(own.Value),
				c.up()[0].name, held.Version, len(v.Statuses[name].Replicas), func() int {
					k := 0
					for _, o := range view.Owners(v.All, v.Placement).Node {
						if o == name {
							k++
						}
					}
					return k
				}())
		}
	}
}

// explainFormation logs why the cluster did not form: what the first
// nodes see, which records n0000 misses or holds stale, and the packets
// and records dropped.
func (c *simCluster) explainFormation() {
	t := c.t
	for _, nd := range c.nodes[:3] {
		v := nd.agent.views.View()
		notReady := 0
		for _, s := range v.Statuses {
			if !s.SubnetReady {
				notReady++
			}
		}
		t.Logf("%s: %d members, %d records, %d not ready, synced %v, subnet %q ready %v", nd.name, nd.agent.mem.cluster.NumMembers(), len(v.Statuses), notReady,
			nd.agent.mem.members.IsSynced(), nd.agent.own.subnets.current().Subnet, nd.agent.own.subnets.settled.Load())
	}
	v0 := c.nodes[0].agent.views.View()
	for _, nd := range c.nodes {
		if _, ok := v0.Statuses[nd.name]; ok {
			continue
		}
		rec, held, _ := nd.store.Get(view.StatusKey(nd.name))
		t.Logf("%s missing at n0000: %d members, synced %v, subnet %q ready %v, own record held %v (%d bytes, version %v)", nd.name,
			nd.agent.mem.cluster.NumMembers(), nd.agent.mem.members.IsSynced(), nd.agent.own.subnets.current().Subnet, nd.agent.own.subnets.settled.Load(),
			held, len(rec.Value), rec.Version)
		mine := nd.agent.own.subnets.current()
		for other, st := range v0.Statuses {
			if st.PodSubnet == mine.Subnet {
				seen, ok := heldStatus(nd.store, nd.agent.own.subnets.clusterCIDR, other)
				t.Logf("   %s holds %s at n0000 (since %v ready %v); at %s: held %v since %v ready %v; mine since %v",
					other, st.PodSubnet, st.SubnetSince, st.SubnetReady, nd.name, ok, seen.SubnetSince, seen.SubnetReady, mine.Since)
			}
		}
	}
	var dropped int64
	for _, nd := range c.nodes {
		dropped += nd.tr.Dropped()
	}
	t.Logf("packets dropped by full queues: %d", dropped)
	if mfs, err := c.nodes[0].agent.metrics.reg.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() == "starling_rejected_records_total" {
				for _, m := range mf.GetMetric() {
					t.Logf("n0000 rejected %v: %v", m.GetLabel(), m.GetCounter().GetValue())
				}
			}
		}
	}
	// Records ready at their node but not in n0000's view: lost on the
	// way (n0000's store has the old one) or not taken into the view
	// (its store has the ready one).
	inStore, lost := 0, 0
	for _, nd := range c.nodes {
		if s, ok := v0.Statuses[nd.name]; ok && !s.SubnetReady && nd.agent.own.subnets.settled.Load() {
			if held, ok := heldStatus(c.nodes[0].store, nd.agent.own.subnets.clusterCIDR, nd.name); ok && held.SubnetReady {
				inStore++
			} else {
				lost++
			}
		}
	}
	t.Logf("n0000: %d records ready at their node are not ready in its view: %d of them ready in its store, %d not", inStore+lost, inStore, lost)
	var pruned int64
	for _, nd := range c.nodes {
		pruned += nd.agent.mem.cluster.DeltasPruned()
	}
	t.Logf("deltas dropped from full queues: %d", pruned)
}

// simSkip reports whether STARLING_SIM_SKIP (a comma-separated list)
// names phase: "fail" (the failure and return without workload),
// "spread" (the spread of 20 writes with workload), "busy" (10 writes a
// second). At 1,000 nodes on 2 cores the busy phase alone would take
// hours of real time.
func simSkip(phase string) bool {
	return slices.Contains(strings.Split(os.Getenv("STARLING_SIM_SKIP"), ","), phase)
}

// busy measures the cluster under 10 writes a second (scales of
// Deployments, each with an annotation that changes) for a minute.
func (c *simCluster) busy(report func(string, ...any), deployments int) {
	n := len(c.nodes)
	stop := make(chan struct{})
	var writers sync.WaitGroup
	writers.Add(1)
	go func() {
		defer writers.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			obj := simDeployment(fmt.Sprintf("sim-%03d", i%deployments), 100)
			obj.Deployment.Annotations = map[string]string{"sim/write": strconv.Itoa(i)}
			c.nodes[i%n].agent.api.objects.store([]manifest.Object{obj})
		}
	}()
	busy := c.measure(60 * time.Second)
	close(stop)
	writers.Wait()
	report("10 writes/s: gossip %.0f B/s and %.1f packets/s per node, CPU %.3f%% of a core per node",
		busy.bytesPerNode, busy.packetsPerNode, busy.cpuPerNode*100)
}
