package node

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	_ "net/http/pprof"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/testnet"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/store"
	"github.com/starling-orchestrator/starling/node/view"
)

// The scale simulation: an in-process cluster of N real agents (real
// gossip, the real view, placement, decision and quorum code) on an
// in-memory network (testnet.Mem, 1 ms one-way latency) with fake
// runtimes, inside a testing/synctest bubble. Timers run on the bubble's
// virtual clock, which moves only when every goroutine of the cluster is
// blocked: however slowly this machine runs N agents, no probe is ever
// late in the cluster's own time, so failure detection and every figure
// in virtual time are what a real network of N nodes would show. CPU
// figures are real CPU time (getrusage) per node per virtual second.
//
//	STARLING_SIM=100,300 go test ./node -run TestScaleSimulation -v -timeout 2h
//
// make bench runs N = 100 and 300, each with its workload; N = 1000 with
// STARLING_SIM=1000. STARLING_SIM_PPROF=localhost:6060 serves pprof
// during a run; STARLING_SIM_NO_WORKLOAD=1 stops after the phases
// without replicas (formation, idle, failure and return, the spread of 20
// writes); STARLING_SIM_SKIP leaves phases out (simSkip).
// STARLING_SIM_SHARE=1 has the agents decode identical records once for
// all (node/view/decodeshare.go): the workload of 1,000 agents then fits in 24 GB,
// and their CPU figures leave out all but one decoding of each desired
// object's replicas and of each node record.

// simNode is one agent of the simulation.
type simNode struct {
	name  string
	tr    *testnet.MemTransport
	rt    *fakeRuntime
	store *store.Memory
	dir   string // the data dir (identity key): kept across restarts
	// prior is what the node's earlier transports (before restarts) sent.
	prior testnet.Counters
	// priorWrites is what the node's earlier agents (before restarts)
	// counted in starling_node_status_writes_total.
	priorWrites float64
	agent       *Agent
	cancel      context.CancelFunc
	wg          *sync.WaitGroup
	down        bool
	conf        func(*testSetup) // when set, changes its agent's configuration
}

// simCluster is the simulated cluster.
type simCluster struct {
	t     *testing.T
	mem   *testnet.Mem
	nodes []*simNode
	// pubs classifies the node records published (simpubs_test.go).
	pubs *simPubs
	// pool holds the record bytes the nodes' stores share, and share
	// what the agents decode from them (node/view/decodeshare.go).
	pool  *store.Pool
	share *view.DecodeShare
}

// simConfig is an agent's configuration in the simulation: production
// defaults (memberlist's LAN timing, the agent's flags) but for what
// cannot exist in a bubble (no disk store, no watchdog process).
func simConfig(name, dir string, join []string, tr *testnet.MemTransport) testSetup {
	cfg := testSetup{Config: DefaultConfig()}
	cfg.Name, cfg.DataDir, cfg.Join = name, dir, join
	cfg.Insecure = true
	cfg.FenceWatchdog = false
	// The default --cluster-cidr, a /16, holds 256 nodes' /24s; a /12
	// holds 4,096.
	cfg.ClusterCIDR = "10.64.0.0/12"
	cfg.tuneGossip = func(g *gossip.Config) {
		g.Transport = tr
		g.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if os.Getenv("STARLING_SIM_LOG") != "" {
			g.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
	}
	return cfg
}

// startNode starts (or restarts, keeping its store) node n.
func (c *simCluster) startNode(n *simNode, join []string) {
	t := c.t
	if n.tr != nil {
		was := n.tr.Counters()
		n.prior.PacketBytes += was.PacketBytes
		n.prior.Packets += was.Packets
		n.prior.StreamBytes += was.StreamBytes
		n.prior.Streams += was.Streams
	}
	if n.agent != nil {
		n.priorWrites += testutil.ToFloat64(n.agent.metrics.statusWrites)
	}
	n.tr = c.mem.Transport(n.name)
	if n.dir == "" {
		n.dir = t.TempDir()
	}
	cfg := simConfig(n.name, n.dir, join, n.tr)
	cfg.store, cfg.shareDecodes = n.store, c.share
	if c.pubs != nil {
		cfg.store = &publishedStore{Store: n.store, node: n.name, pubs: c.pubs}
	}
	if n.conf != nil {
		n.conf(&cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("STARLING_SIM_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	a, err := newAgent(context.Background(), cfg.Config, cfg.hooks, log, n.rt, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.agent, n.down = a, false
	n.rt.subnet = func() string { return a.own.subnets.current().Subnet }
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg = a.start(ctx)
}

// crash stops node n as a power cut would: no leave, its containers gone.
func (c *simCluster) crash(n *simNode) {
	n.tr.Shutdown()
	n.cancel()
	n.wg.Wait()
	n.agent.work.replicas.wg.Wait()
	n.agent.mem.cluster.Shutdown()
	n.rt.mu.Lock()
	n.rt.containers = map[string]reconcile.Container{}
	n.rt.mu.Unlock()
	n.down = true
}

// stopAll stops every node, then waits for what memberlist leaves
// behind (a probe waiting for its timeout) to end on virtual time.
func (c *simCluster) stopAll() {
	defer time.Sleep(30 * time.Second)
	for _, n := range c.nodes {
		if !n.down {
			n.cancel()
		}
	}
	for _, n := range c.nodes {
		if !n.down {
			n.wg.Wait()
			n.agent.work.replicas.wg.Wait()
			n.agent.mem.cluster.Shutdown()
			n.tr.Shutdown()
		}
	}
}

func TestScaleSimulation(t *testing.T) {
	// Without STARLING_SIM, a cluster of 12 (about 10 s) keeps the
	// simulation and what it asserts working.
	spec := cmp.Or(os.Getenv("STARLING_SIM"), "12")
	// STARLING_SIM_PPROF=localhost:6060 serves net/http/pprof (outside the
	// bubble) to profile one phase of a long run while it runs.
	if addr := os.Getenv("STARLING_SIM_PPROF"); addr != "" {
		go func() { fmt.Fprintln(os.Stderr, "STARLING_SIM_PPROF:", http.ListenAndServe(addr, nil)) }()
	}
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 3 {
			t.Fatalf("STARLING_SIM=%q: want node counts of 3 or more, e.g. 100,300", spec)
		}
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) { synctest.Test(t, func(t *testing.T) { simulate(t, n) }) })
	}
}

// simulate runs the scenario on n nodes and logs its figures.
func simulate(t *testing.T, n int) {
	c := &simCluster{t: t, mem: testnet.NewMem(time.Millisecond), pubs: newSimPubs(), pool: store.NewPool()}
	if os.Getenv("STARLING_SIM_SHARE") != "" {
		c.share = view.NewDecodeShare()
	}
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	cpu0, real0 := cpuTime(), realNow()
	report := func(format string, args ...any) {
		t.Logf("N=%d  %s", n, fmt.Sprintf(format, args...))
	}
	// Join in batches of 50 a second, each through a random earlier node
	// (one seed for a thousand joins at once would only measure its
	// queue).
	for i := range n {
		nd := &simNode{name: fmt.Sprintf("n%04d", i), rt: newFakeRuntime(), store: store.NewMemoryPooled(c.pool)}
		var join []string
		if i > 0 {
			join = []string{c.nodes[rng.IntN(i)].tr.Addr()}
		}
		c.startNode(nd, join)
		c.nodes = append(c.nodes, nd)
		if i%50 == 49 {
			time.Sleep(time.Second)
		}
	}
	defer c.stopAll()
	// Claims settle in rounds that take longer as gossip carries more
	// joins: 26 s at 100 nodes, 2m34s at 300.
	// Progress, every 30 s of the cluster's time: how many nodes see the
	// whole cluster formed, and the fewest members and records one sees.
	formed0, next := time.Now(), 30*time.Second
	formWait := max(3*time.Minute, time.Duration(n)*600*time.Millisecond)
	if d, err := time.ParseDuration(os.Getenv("STARLING_SIM_FORM_WAIT")); err == nil {
		formWait = d // to see explainFormation sooner
	}
	took, ok := wait(formWait, 500*time.Millisecond, func() bool {
		done, fewestMembers, fewestRecords, selfReady := 0, n, n, 0
		settled := map[string]int{}
		for _, nd := range c.nodes {
			if nd.agent.own.subnets.settled.Load() {
				selfReady++
				settled[nd.agent.own.subnets.current().Subnet]++
			}
			v := nd.agent.views.View()
			members, ready := nd.agent.mem.cluster.NumMembers(), 0
			for _, s := range v.Statuses {
				if s.SubnetReady {
					ready++
				}
			}
			fewestMembers, fewestRecords = min(fewestMembers, members), min(fewestRecords, ready)
			if members == n && ready == n {
				done++
			}
		}
		if time.Since(formed0) >= next {
			next += 30 * time.Second
			var pruned int64
			for _, nd := range c.nodes {
				pruned += nd.agent.mem.cluster.DeltasPruned()
			}
			report("forming, %v after the last join (real %v): %d nodes formed; fewest members seen %d, fewest ready records %d (ready at their own node %d, subnets settled twice %d); deltas dropped from full queues %d",
				time.Since(formed0).Round(time.Second), realSince(real0).Round(time.Second), done, fewestMembers, fewestRecords, selfReady, selfReady-len(settled), pruned)
		}
		return done == n
	})
	if !ok {
		bySubnet := map[string][]*simNode{}
		for _, nd := range c.nodes {
			bySubnet[nd.agent.own.subnets.current().Subnet] = append(bySubnet[nd.agent.own.subnets.current().Subnet], nd)
		}
		for sub, nds := range bySubnet {
			if len(nds) < 2 {
				continue
			}
			for _, nd := range nds {
				claim, check := nd.agent.own.subnets.current(), nd.agent.own.subnets.lastCheck.Load()
				t.Logf("%s settled twice: %s since %v, its check: %s", sub, nd.name, claim.Since, check)
			}
		}
		c.explainFormation()
		t.Fatalf("the cluster did not form in %v", took)
	}
	settled := map[string]string{}
	for _, nd := range c.nodes {
		sub := nd.agent.own.subnets.current().Subnet
		if other, dup := settled[sub]; dup {
			t.Errorf("%s and %s both settled on %s", other, nd.name, sub)
		}
		settled[sub] = nd.name
	}
	report("formed: every node sees %d members and %d ready node records %v after the last join (real %v, CPU %v)",
		n, n, took.Round(time.Millisecond), realSince(real0).Round(time.Second), (cpuTime() - cpu0).Round(time.Second))

	// Idle, no workload.
	time.Sleep(30 * time.Second)
	if k, _ := strconv.Atoi(os.Getenv("STARLING_SIM_IDLE_WINDOWS")); k > 0 {
		// The spread of the idle CPU over k windows of 60 s, then stop:
		// what tells a change between two commits from noise.
		var cpus []float64
		for range k {
			f := c.measure(time.Minute)
			cpus = append(cpus, f.cpuPerNode*100)
			report("idle window of 60 s: CPU %.3f%% of a core per node, gossip %.0f B/s per node", f.cpuPerNode*100, f.bytesPerNode)
		}
		slices.Sort(cpus)
		report("idle CPU over %d windows of 60 s: median %.3f%%, range %.3f%% to %.3f%%", k, cpus[k/2], cpus[0], cpus[k-1])
		return
	}
	window := 60 * time.Second
	if os.Getenv("STARLING_SIM_IDLE_ONLY") != "" {
		window = 5 * time.Minute // most of a CPU profile of the run is then the idle cluster
	}
	k0 := c.streamKinds()
	idle := c.measure(window)
	report("idle, no workload: gossip %.0f B/s and %.1f packets/s per node (of which %.1f quorum questions/s, each answered), CPU %.3f%% of a core per node; streams in %v: %s; packets by kind: %s",
		idle.bytesPerNode, idle.packetsPerNode, idle.questionsPerNode, idle.cpuPerNode*100, window, c.streamKindsSince(k0), idle.byKind())
	if os.Getenv("STARLING_SIM_IDLE_ONLY") != "" {
		return // (profiling the idle cluster: go test -cpuprofile)
	}

	if !simSkip("fail") {
		c.failAndReturn(rng, report, "no workload", 0, idle)
	}

	// 10 replicas per node: n/10 Deployments of 100.
	deployments := max(1, n/10)
	replicas := 100 * deployments
	if os.Getenv("STARLING_SIM_NO_WORKLOAD") != "" {
		// (a run at 1,000 nodes in reach of 2 cores: the spread of
		// writes of Deployments of no replicas, then stop)
		c.writeSpread(rng, report, deployments, 0)
		report("run: real %v, CPU %v", realSince(real0).Round(time.Second), (cpuTime() - cpu0).Round(time.Second))
		return
	}
	p0 := c.placements()
	for d := range deployments {
		if _, err := c.nodes[rng.IntN(n)].agent.api.objects.store([]manifest.Object{simDeployment(fmt.Sprintf("sim-%03d", d), 100)}); err != nil {
			t.Fatal(err)
		}
	}
	took, ok = wait(5*time.Minute, 100*time.Millisecond, func() bool { return c.singleOwners(replicas) })
	report("%d Deployments (%d replicas) applied: every replica has exactly one owner after %v (ok %v); placements per node per write %.2f",
		deployments, replicas, took.Round(time.Millisecond), ok, (c.placements()-p0)/float64(n*deployments))
	if !ok {
		c.explainOwners(report, replicas)
		t.Errorf("N=%d: %d replicas applied do not each run exactly once after %v", n, replicas, took)
	}
	calm := c.settle()
	k0, w0 := c.streamKinds(), c.statusWrites()
	idleLoaded := c.measure(60 * time.Second)
	report("idle, %d replicas (%s): gossip %.0f B/s and %.1f packets/s per node, CPU %.3f%% of a core per node; %.0f node records written; streams: %s; packets by kind: %s",
		replicas, calm, idleLoaded.bytesPerNode, idleLoaded.packetsPerNode, idleLoaded.cpuPerNode*100, c.statusWrites()-w0, c.streamKindsSince(k0), idleLoaded.byKind())
	if !simSkip("spread") {
		c.writeSpread(rng, report, deployments, 100)
	}
	if !simSkip("busy") {
		c.busy(report, deployments)
	}

	// 1 % of the nodes fail and return, with the workload running.
	wait(time.Minute, 100*time.Millisecond, func() bool { return c.singleOwners(replicas) })
	c.failAndReturn(rng, report, "with 10 replicas a node", replicas, idleLoaded)
	report("run: real %v, CPU %v", realSince(real0).Round(time.Second), (cpuTime() - cpu0).Round(time.Second))
}

// writeSpread writes 20 Deployments of replicas replicas (a scale of one
// of deployments each, with an annotation that changes), one at a time
// from random nodes, and reports the time until every node holds each.
func (c *simCluster) writeSpread(rng *rand.Rand, report func(string, ...any), deployments, replicas int) {
	n := len(c.nodes)
	var spread []time.Duration
	p0 := c.placements()
	for w := range 20 {
		nd := c.nodes[rng.IntN(n)]
		obj := simDeployment(fmt.Sprintf("sim-%03d", w%deployments), replicas)
		obj.Deployment.Annotations = map[string]string{"sim/spread": strconv.Itoa(w)}
		if _, err := nd.agent.api.objects.store([]manifest.Object{obj}); err != nil {
			c.t.Fatal(err)
		}
		rec, _, _ := nd.store.Get(obj.Key())
		took, _ := wait(3*time.Minute, 10*time.Millisecond, func() bool {
			for _, o := range c.nodes {
				if r, ok, _ := o.store.Get(obj.Key()); !ok || r.Version.Compare(rec.Version) < 0 {
					return false
				}
			}
			return true
		})
		spread = append(spread, took)
		time.Sleep(2 * time.Second)
	}
	report("one write to every node (20 writes, Deployments of %d replicas): median %v, p99 %v; placements per node per write %.2f",
		replicas, percentile(spread, 50).Round(time.Millisecond), percentile(spread, 99).Round(time.Millisecond), (c.placements()-p0)/float64(20*n))
}
