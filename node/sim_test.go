package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/testnet"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/store"
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
// make bench runs N = 100 and 300; N = 1000 with STARLING_SIM=1000.

// simNode is one agent of the simulation.
type simNode struct {
	name   string
	tr     *testnet.MemTransport
	rt     *fakeRuntime
	store  *store.Memory
	agent  *Agent
	cancel context.CancelFunc
	wg     *sync.WaitGroup
	down   bool
}

// simCluster is the simulated cluster.
type simCluster struct {
	t     *testing.T
	mem   *testnet.Mem
	nodes []*simNode
}

// simConfig is an agent's configuration in the simulation: production
// defaults (memberlist's LAN timing, the agent's flags) but for what
// cannot exist in a bubble (no disk store, no watchdog process).
func simConfig(name, dir string, join []string, tr *testnet.MemTransport) Config {
	cfg := DefaultConfig()
	cfg.Name, cfg.DataDir, cfg.Join = name, dir, join
	cfg.Insecure = true
	cfg.FenceWatchdog = false
	cfg.tuneGossip = func(g *gossip.Config) {
		g.Transport = tr
		g.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return cfg
}

// startNode starts (or restarts, keeping its store) node n.
func (c *simCluster) startNode(n *simNode, join []string) {
	t := c.t
	n.tr = c.mem.Transport(n.name)
	cfg := simConfig(n.name, t.TempDir(), join, n.tr)
	cfg.store = n.store
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("STARLING_SIM_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	a, err := newAgent(context.Background(), cfg, log, n.rt, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.agent, n.down = a, false
	n.rt.subnet = func() string { return a.subnets.current().Subnet }
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg = a.start(ctx)
}

// crash stops node n as a power cut would: no leave, its containers gone.
func (c *simCluster) crash(n *simNode) {
	n.tr.Shutdown()
	n.cancel()
	n.wg.Wait()
	n.agent.replicas.wg.Wait()
	n.agent.cluster.Shutdown()
	n.rt.mu.Lock()
	n.rt.containers = map[string]reconcile.Container{}
	n.rt.mu.Unlock()
	n.down = true
}

func (c *simCluster) stopAll() {
	for _, n := range c.nodes {
		if !n.down {
			n.cancel()
		}
	}
	for _, n := range c.nodes {
		if !n.down {
			n.wg.Wait()
			n.agent.replicas.wg.Wait()
			n.agent.cluster.Shutdown()
			n.tr.Shutdown()
		}
	}
}

// cpuTime is the process's CPU time so far (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// up returns the nodes not crashed.
func (c *simCluster) up() []*simNode {
	var out []*simNode
	for _, n := range c.nodes {
		if !n.down {
			out = append(out, n)
		}
	}
	return out
}

// bytes is what the transports of all nodes have sent so far.
func (c *simCluster) bytes() (total, packets int64) {
	for _, n := range c.nodes {
		cn := n.tr.Counters()
		total += cn.Total()
		packets += cn.Packets
	}
	return total, packets
}

// questions is the sum of every node's quorum questions.
func (c *simCluster) questions() int64 {
	var n int64
	for _, nd := range c.nodes {
		n += nd.agent.fence.questions.Load()
	}
	return n
}

// placements is the sum of every up node's placement computations.
func (c *simCluster) placements() float64 {
	sum := 0.0
	for _, n := range c.up() {
		sum += testutil.ToFloat64(n.agent.metrics.placements)
	}
	return sum
}

// wait polls cond every step (virtual) until it holds or limit passes,
// and returns how long it took.
func wait(limit, step time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			return time.Since(start), false
		}
		time.Sleep(step)
	}
	return time.Since(start), true
}

// singleOwners reports whether, over the up nodes' runtimes, every
// replica of the simulation's Deployments runs exactly once and want of
// them run.
func (c *simCluster) singleOwners(want int) bool {
	seen := map[string]int{}
	for _, n := range c.up() {
		n.rt.mu.Lock()
		for id, ct := range n.rt.containers {
			if ct.State == reconcile.StateRunning && strings.HasPrefix(ct.Workload, "sim-") {
				seen[id]++
			}
		}
		n.rt.mu.Unlock()
	}
	if len(seen) != want {
		return false
	}
	for _, k := range seen {
		if k != 1 {
			return false
		}
	}
	return true
}

// percentile is the p-th percentile (0..100) of ds, sorted in place.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := (len(ds)*p + 99) / 100
	return ds[min(max(i-1, 0), len(ds)-1)]
}

func simDeployment(name string, replicas int) manifest.Object {
	objs, err := manifest.Parse([]byte(fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %s}
spec:
  replicas: %d
  selector: {matchLabels: {app: %s}}
  template:
    metadata: {labels: {app: %s}}
    spec:
      containers: [{name: c, image: "sim:v1"}]
`, name, replicas, name, name)), "sim")
	if err != nil {
		panic(err)
	}
	return objs[0]
}

func TestScaleSimulation(t *testing.T) {
	spec := os.Getenv("STARLING_SIM")
	if spec == "" {
		t.Skip("set STARLING_SIM=100,300 to run the scale simulation")
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
	c := &simCluster{t: t, mem: testnet.NewMem(time.Millisecond)}
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	cpu0, real0 := cpuTime(), realNow()
	report := func(format string, args ...any) {
		t.Logf("N=%d  %s", n, fmt.Sprintf(format, args...))
	}
	// Join in batches of 50 a second, each through a random earlier node
	// (one seed for a thousand joins at once would only measure its
	// queue).
	for i := range n {
		nd := &simNode{name: fmt.Sprintf("n%04d", i), rt: newFakeRuntime(), store: store.NewMemory()}
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
	took, ok := wait(10*time.Minute, 500*time.Millisecond, func() bool {
		for _, nd := range c.nodes {
			v := nd.agent.views.view()
			if nd.agent.cluster.NumMembers() != n || len(v.statuses) != n {
				return false
			}
			for _, s := range v.statuses {
				if !s.SubnetReady {
					return false
				}
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("the cluster did not form in %v", took)
	}
	report("formed: every node sees %d members and %d ready node records %v after the last join (real %v, CPU %v)",
		n, n, took.Round(time.Millisecond), realSince(real0).Round(time.Second), (cpuTime() - cpu0).Round(time.Second))

	// Idle, no workload.
	time.Sleep(30 * time.Second)
	idle := c.measure(60 * time.Second)
	report("idle, no workload: gossip %.0f B/s and %.1f packets/s per node (of which %.1f quorum questions/s, each answered), CPU %.3f%% of a core per node",
		idle.bytesPerNode, idle.packetsPerNode, idle.questionsPerNode, idle.cpuPerNode*100)

	// 10 replicas per node: n/10 Deployments of 100.
	replicas := 10 * n
	deployments := n / 10
	p0 := c.placements()
	for d := range deployments {
		if _, err := c.nodes[rng.IntN(n)].agent.objects.store([]manifest.Object{simDeployment(fmt.Sprintf("sim-%03d", d), 100)}); err != nil {
			t.Fatal(err)
		}
	}
	took, ok = wait(5*time.Minute, 100*time.Millisecond, func() bool { return c.singleOwners(replicas) })
	report("%d Deployments (%d replicas) applied: every replica has exactly one owner after %v (ok %v); placements per node per write %.2f",
		deployments, replicas, took.Round(time.Millisecond), ok, (c.placements()-p0)/float64(n*deployments))
	time.Sleep(30 * time.Second)
	idleLoaded := c.measure(60 * time.Second)
	report("idle, %d replicas: gossip %.0f B/s and %.1f packets/s per node, CPU %.3f%% of a core per node",
		replicas, idleLoaded.bytesPerNode, idleLoaded.packetsPerNode, idleLoaded.cpuPerNode*100)

	// One write's spread: 20 writes (a scale of one Deployment each), one
	// at a time, from random nodes; the time until every node holds it.
	var spread []time.Duration
	p0 = c.placements()
	for w := range 20 {
		nd := c.nodes[rng.IntN(n)]
		obj := simDeployment(fmt.Sprintf("sim-%03d", w%deployments), 100+(w%2))
		if _, err := nd.agent.objects.store([]manifest.Object{obj}); err != nil {
			t.Fatal(err)
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
	report("one write to every node (20 writes): median %v, p99 %v; placements per node per write %.2f",
		percentile(spread, 50).Round(time.Millisecond), percentile(spread, 99).Round(time.Millisecond), (c.placements()-p0)/float64(20*n))

	// Under 10 writes a second (scales of random Deployments).
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
			c.nodes[i%n].agent.objects.store([]manifest.Object{obj})
		}
	}()
	busy := c.measure(60 * time.Second)
	close(stop)
	writers.Wait()
	report("10 writes/s: gossip %.0f B/s and %.1f packets/s per node, CPU %.3f%% of a core per node",
		busy.bytesPerNode, busy.packetsPerNode, busy.cpuPerNode*100)

	// 1 % of the nodes fail (power cut: no leave, containers gone).
	wait(time.Minute, 100*time.Millisecond, func() bool { return c.singleOwners(replicas) })
	fail := max(1, n/100)
	var failed []*simNode
	for _, i := range rng.Perm(n)[:fail] {
		failed = append(failed, c.nodes[i])
	}
	cut := time.Now()
	for _, f := range failed {
		c.crash(f)
	}
	detected, ok := wait(5*time.Minute, 100*time.Millisecond, func() bool {
		for _, o := range c.up() {
			for _, m := range o.agent.cluster.Members() {
				for _, f := range failed {
					if m.Name == f.name && m.State.Up() {
						return false
					}
				}
			}
		}
		return true
	})
	took, ok2 := wait(5*time.Minute, 100*time.Millisecond, func() bool { return c.singleOwners(replicas) })
	report("%d nodes failed: every node saw them dead %v after the cut (ok %v); every replica has exactly one owner %v after that (ok %v)",
		fail, detected.Round(time.Millisecond), ok, took.Round(time.Millisecond), ok2)
	_ = cut

	// They return (same names, addresses and stores; no containers).
	time.Sleep(30 * time.Second)
	b0, _ := c.bytes()
	back := time.Now()
	for _, f := range failed {
		c.startNode(f, []string{c.up()[0].tr.Addr()})
	}
	took, ok = wait(5*time.Minute, 100*time.Millisecond, func() bool {
		for _, o := range c.nodes {
			if o.agent.cluster.NumMembers() != n {
				return false
			}
		}
		return c.singleOwners(replicas)
	})
	time.Sleep(time.Minute - time.Since(back))
	b1, _ := c.bytes()
	extra := float64(b1-b0) - idleLoaded.bytesPerNode*float64(n)*time.Minute.Seconds()
	report("%d nodes returned: every replica has exactly one owner again %v later (ok %v); the returns cost the cluster %.2f MB over the idle traffic in the first minute (%.2f MB per node)",
		fail, took.Round(time.Millisecond), ok, extra/1e6, extra/1e6/float64(fail))
	report("run: real %v, CPU %v", realSince(real0).Round(time.Second), (cpuTime() - cpu0).Round(time.Second))
}

// figures are traffic and CPU over a window.
type figures struct {
	bytesPerNode, packetsPerNode, cpuPerNode float64
	// questionsPerNode are the quorum questions a node asks a second
	// (each answered: twice the packets).
	questionsPerNode float64
}

// measure sleeps window (virtual) and returns the per node, per second
// traffic and CPU over it.
func (c *simCluster) measure(window time.Duration) figures {
	b0, p0 := c.bytes()
	q0 := c.questions()
	cpu0 := cpuTime()
	time.Sleep(window)
	b1, p1 := c.bytes()
	q1 := c.questions()
	cpu := cpuTime() - cpu0
	up := float64(len(c.up()))
	secs := window.Seconds()
	return figures{bytesPerNode: float64(b1-b0) / up / secs, packetsPerNode: float64(p1-p0) / up / secs,
		cpuPerNode: cpu.Seconds() / up / secs, questionsPerNode: float64(q1-q0) / up / secs}
}

// realNow is the machine's monotonic clock, outside the bubble's.
func realNow() time.Duration {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

func realSince(t0 time.Duration) time.Duration { return realNow() - t0 }
