package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/test/harness"
)

// The cluster figures (issue #5): on 3 nodes with real containerd, how
// long a cut-off node's Service endpoints stay in the other nodes' rules
// and how long until its replicas run elsewhere, and how long a rolling
// update of 10 replicas takes.
const (
	clusterNodes     = 3
	failoverReplicas = 6
	rolloutReplicas  = 10
	echoPort         = 8080
)

// clusterFigures are the cluster group's results.
type clusterFigures struct {
	rulesGone []time.Duration            // cut -> endpoints gone from every remaining node's rules
	replaced  []time.Duration            // cut -> replicas ready on the remaining nodes
	rollout   map[string][]time.Duration // strategy label -> apply -> rolled out
}

// rolloutStrategies are the strategies timed, in order: the label printed,
// the Deployment's name and its strategy (the zero value leaves Kubernetes' default,
// RollingUpdate 25%/25%: for 10 replicas 2 unavailable, 3 surge).
var rolloutStrategies = []struct {
	label, deployment string
	strategy          appsv1.DeploymentStrategy
}{
	{"default 25%/25%", "roll-default", appsv1.DeploymentStrategy{}},
	{"maxUnavailable=1,maxSurge=0", "roll-one", appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr(intstr.FromInt32(1)), MaxSurge: ptr(intstr.FromInt32(0))}}},
}

func ptr[T any](v T) *T { return &v }

// clusterBench runs the cluster group and prints it. Ctrl-C or SIGTERM
// stops it and still tears the cluster down.
func clusterBench(a artifacts, failoverRuns, rolloutRuns int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fd := gossip.DefaultConfig()
	detection := []string{"--probe-interval", fd.ProbeInterval.String(),
		"--probe-timeout", fd.ProbeTimeout.String(), "--suspicion-mult", fmt.Sprint(fd.SuspicionMult)}

	c, err := harness.NewNamed(filepath.Join(a.dir, "cluster"), fmt.Sprintf("stbclu%d-", os.Getpid()), a.binary, nil)
	if err != nil {
		return fmt.Errorf("create cluster: %w", err)
	}
	defer c.Close()
	loadBefore := loadAverage()
	figs, err := measureCluster(ctx, c, a.echoTar, detection, failoverRuns, rolloutRuns)
	if err != nil {
		if ctx.Err() == nil {
			for _, n := range c.Nodes {
				fmt.Fprintf(os.Stderr, "---- %s agent log (last 20 lines) ----\n%s\n", n.Name, n.Tail(20))
			}
		}
		return err
	}
	printCluster(figs, detection, loadBefore, loadAverage(), failoverRuns, rolloutRuns)
	return nil
}

// measureCluster brings up the nodes and takes the figures.
func measureCluster(ctx context.Context, c *harness.Cluster, echoTar string, agentArgs []string, failoverRuns, rolloutRuns int) (clusterFigures, error) {
	var figs clusterFigures
	if err := startNodes(ctx, c, echoTar, agentArgs); err != nil {
		return figs, err
	}
	var err error
	if figs.rulesGone, figs.replaced, err = failover(ctx, c, failoverRuns); err != nil {
		return figs, err
	}
	figs.rollout = map[string][]time.Duration{}
	for _, s := range rolloutStrategies {
		ds, err := rollouts(ctx, c.Nodes, s.deployment, s.strategy, rolloutRuns)
		if err != nil {
			return figs, err
		}
		figs.rollout[s.label] = ds
	}
	return figs, nil
}

// startNodes starts clusterNodes agents, imports the echo image on each
// (so no figure includes an image fetch) and waits until every node sees
// all of them alive.
func startNodes(ctx context.Context, c *harness.Cluster, echoTar string, agentArgs []string) error {
	for i := 1; i <= clusterNodes; i++ {
		n, err := c.AddNode(fmt.Sprintf("n%d", i), i)
		if err != nil {
			return fmt.Errorf("add node n%d: %w", i, err)
		}
		if err := n.StartAgent(agentArgs...); err != nil {
			return fmt.Errorf("start agent n%d: %w", i, err)
		}
		if _, err := n.CLI("image", "import", echoTar); err != nil {
			return fmt.Errorf("import echo image on n%d: %w", i, err)
		}
	}
	_, err := waitUntil(ctx, time.Now(), time.Minute, "all nodes alive", func() (bool, error) {
		return allAlive(c.Nodes)
	})
	return err
}

func allAlive(nodes []*harness.Node) (bool, error) {
	for _, n := range nodes {
		out, err := n.CLI("get", "nodes")
		if err != nil {
			return false, err
		}
		if got := strings.Count(out, " alive "); got != len(nodes) {
			return false, fmt.Errorf("%s sees %d of %d nodes alive", n.Name, got, len(nodes))
		}
	}
	return true, nil
}

// deploymentYAML is a Deployment of the echo image with an httpGet
// readiness probe every second; message (an env value) sets the spec hash.
func deploymentYAML(name string, replicas int, strategy appsv1.DeploymentStrategy, message string) string {
	app := harness.App{Name: name, Replicas: int32(replicas), Grace: harness.Seconds(2), Env: harness.Env("MESSAGE", message),
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: echoPort}}, Readiness: harness.HTTPProbe("/healthz", 0)}
	return app.Deployment(func(d *appsv1.Deployment) { d.Spec.Strategy = strategy })
}

// serviceYAML is a ClusterIP Service selecting the Deployment name.
func serviceYAML(name string) string {
	return harness.App{Name: name}.Service(name, []corev1.ServicePort{harness.ServicePort(80, "http")})
}

func apply(n *harness.Node, manifest string) error {
	if _, err := n.CLIInput(strings.NewReader(manifest), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("apply on %s: %w", n.Name, err)
	}
	return nil
}

// failover cuts a node off runs times and returns, per run, the time from
// the cut to its endpoints gone from the rules of every remaining node,
// and to failoverReplicas ready replicas on the remaining nodes. Between
// runs the node comes back and the cluster rebalances. The nodes cut are
// n2, n3, n2, ...: n1, the seed the others joined through, stays up.
func failover(ctx context.Context, c *harness.Cluster, runs int) (rulesGone, replaced []time.Duration, err error) {
	const name = "failover"
	n1 := c.Nodes[0]
	if err := apply(n1, harness.Manifests(deploymentYAML(name, failoverReplicas, appsv1.DeploymentStrategy{}, "v1"), serviceYAML(name))); err != nil {
		return nil, nil, err
	}
	for i := 0; i < runs; i++ {
		if err := waitBalanced(ctx, c.Nodes, name); err != nil {
			return nil, nil, fmt.Errorf("failover run %d: %w", i+1, err)
		}
		cut := c.Nodes[1+i%(len(c.Nodes)-1)]
		gone, ready, err := failoverOnce(ctx, c.Nodes, cut, name)
		if err != nil {
			return nil, nil, fmt.Errorf("failover run %d (cut %s): %w", i+1, cut.Name, err)
		}
		rulesGone, replaced = append(rulesGone, gone), append(replaced, ready)
		progress("failover run %d/%d (cut %s): endpoints gone from the rules %v, replicas ready %v",
			i+1, runs, cut.Name, gone.Round(time.Millisecond), ready.Round(time.Millisecond))
		if err := cut.Reconnect(); err != nil {
			return nil, nil, fmt.Errorf("failover run %d: reconnect %s: %w", i+1, cut.Name, err)
		}
	}
	// The rollouts start from all nodes back and settled.
	if err := waitBalanced(ctx, c.Nodes, name); err != nil {
		return nil, nil, fmt.Errorf("after the failover runs: %w", err)
	}
	if _, err := n1.CLI("delete", "deployment", name); err != nil {
		return nil, nil, err
	}
	if _, err := n1.CLI("delete", "service", name); err != nil {
		return nil, nil, err
	}
	return rulesGone, replaced, waitGone(ctx, c.Nodes, name)
}

// waitBalanced waits until every node runs its even share of the
// workload, all ready and nothing else (make-before-break handoffs done),
// and every node's rules hold every endpoint: the state a cut starts from.
func waitBalanced(ctx context.Context, nodes []*harness.Node, workload string) error {
	per := failoverReplicas / len(nodes)
	_, err := waitUntil(ctx, time.Now(), 3*time.Minute, "rebalance "+workload, func() (bool, error) {
		cs, err := takeCensus(nodes, workload)
		if err != nil {
			return false, err
		}
		for _, n := range nodes {
			if cs.ReadyByNode[n.Name] != per || cs.ByNode[n.Name] != per {
				return false, fmt.Errorf("want %d ready copies on each node and no other; ready %v, copies %v", per, cs.ReadyByNode, cs.ByNode)
			}
		}
		var all []string
		for _, ips := range cs.ReadyIPs {
			all = append(all, endpoints(ips)...)
		}
		found, err := endpointsInRules(ctx, nodes, all)
		if err != nil {
			return false, err
		}
		for _, n := range nodes {
			if len(found[n.Name]) != len(all) {
				return false, fmt.Errorf("%s's rules hold %d of the %d endpoints", n.Name, len(found[n.Name]), len(all))
			}
		}
		return true, nil
	})
	return err
}

func endpoints(ips []string) []string {
	var eps []string
	for _, ip := range ips {
		eps = append(eps, fmt.Sprintf("%s:%d", ip, echoPort))
	}
	return eps
}

// failoverOnce cuts node cut off and times, from the cut, (a) its
// endpoints leaving the rules of every remaining node and (b) the
// remaining nodes reporting failoverReplicas ready copies. Both are
// polled concurrently, so neither sampling delays the other.
func failoverOnce(ctx context.Context, nodes []*harness.Node, cut *harness.Node, workload string) (gone, ready time.Duration, err error) {
	before, err := takeCensus([]*harness.Node{cut}, workload)
	if err != nil {
		return 0, 0, err
	}
	cutEndpoints := endpoints(before.ReadyIPs[cut.Name])
	var rest []*harness.Node
	for _, n := range nodes {
		if n != cut {
			rest = append(rest, n)
		}
	}
	t0 := time.Now()
	if err := cut.CutOff(); err != nil {
		return 0, 0, fmt.Errorf("cut off %s: %w", cut.Name, err)
	}
	type result struct {
		took time.Duration
		err  error
	}
	goneCh := make(chan result, 1)
	go func() {
		took, err := waitUntil(ctx, t0, 2*time.Minute, "endpoints of "+cut.Name+" gone from the rules", func() (bool, error) {
			found, err := endpointsInRules(ctx, rest, cutEndpoints)
			if err != nil {
				return false, err
			}
			if len(found) > 0 {
				return false, fmt.Errorf("rules still hold them: %v", found)
			}
			return true, nil
		})
		goneCh <- result{took, err}
	}()
	ready, readyErr := waitUntil(ctx, t0, 3*time.Minute, "replicas ready on the remaining nodes", func() (bool, error) {
		cs, err := takeCensus(rest, workload)
		if err != nil {
			return false, err
		}
		if cs.Available != failoverReplicas {
			return false, fmt.Errorf("%d of %d ready (%v)", cs.Available, failoverReplicas, cs.ReadyByNode)
		}
		return true, nil
	})
	g := <-goneCh
	return g.took, ready, errors.Join(g.err, readyErr)
}

// waitGone waits until no node runs a copy of workload.
func waitGone(ctx context.Context, nodes []*harness.Node, workload string) error {
	_, err := waitUntil(ctx, time.Now(), 2*time.Minute, "delete "+workload, func() (bool, error) {
		cs, err := takeCensus(nodes, workload)
		if err != nil {
			return false, err
		}
		if cs.Existing > 0 {
			return false, fmt.Errorf("%d copies left", cs.Existing)
		}
		return true, nil
	})
	return err
}

// rollouts times runs spec changes of a rolloutReplicas Deployment name
// with the given strategy block: from apply to every copy of the new spec
// hash ready and no copy of an older one left. It deletes the Deployment
// at the end.
func rollouts(ctx context.Context, nodes []*harness.Node, name string, strategy appsv1.DeploymentStrategy, runs int) ([]time.Duration, error) {
	n1 := nodes[0]
	if err := apply(n1, deploymentYAML(name, rolloutReplicas, strategy, "m0")); err != nil {
		return nil, err
	}
	hash, _, err := rolledOut(ctx, nodes, name, "", time.Now())
	if err != nil {
		return nil, fmt.Errorf("rollout %s, first version: %w", name, err)
	}
	var ds []time.Duration
	for i := 1; i <= runs; i++ {
		start := time.Now()
		if err := apply(n1, deploymentYAML(name, rolloutReplicas, strategy, fmt.Sprintf("m%d", i))); err != nil {
			return nil, err
		}
		var took time.Duration
		if hash, took, err = rolledOut(ctx, nodes, name, hash, start); err != nil {
			return nil, fmt.Errorf("rollout %s, run %d: %w", name, i, err)
		}
		ds = append(ds, took)
		progress("rolling update %s %d/%d: %v", name, i, runs, took.Round(time.Millisecond))
	}
	if _, err := n1.CLI("delete", "deployment", name); err != nil {
		return nil, err
	}
	return ds, waitGone(ctx, nodes, name)
}

// rolledOut waits until workload has exactly rolloutReplicas copies, all
// ready and of one spec hash other than old, and returns that hash and
// the time since start.
func rolledOut(ctx context.Context, nodes []*harness.Node, workload, old string, start time.Time) (string, time.Duration, error) {
	var hash string
	took, err := waitUntil(ctx, start, 5*time.Minute, "roll out "+workload, func() (bool, error) {
		cs, err := takeCensus(nodes, workload)
		if err != nil {
			return false, err
		}
		if len(cs.ByHash) != 1 || cs.Existing != rolloutReplicas {
			return false, fmt.Errorf("copies by hash %v, want %d of one new hash", cs.ByHash, rolloutReplicas)
		}
		for h := range cs.ByHash {
			hash = h
		}
		if hash == old || cs.ReadyByHash[hash] != rolloutReplicas {
			return false, fmt.Errorf("hash %s (old %s): %d of %d ready", hash, old, cs.ReadyByHash[hash], rolloutReplicas)
		}
		return true, nil
	})
	return hash, took, err
}

// progress reports one measurement on stderr while the group runs (the
// table comes at the end, after about 10 minutes).
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// loadAverage is the 1-minute load average (/proc/loadavg), to print
// with the figures: the cluster shares the machine's cores.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// stats returns the median, min and max of ds, rounded to milliseconds.
func stats(ds []time.Duration) (med, lo, hi time.Duration) {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return r(s[len(s)/2]), r(s[0]), r(s[len(s)-1])
}

func printCluster(f clusterFigures, detection []string, loadBefore, loadAfter string, failoverRuns, rolloutRuns int) {
	type row struct {
		label string
		ds    []time.Duration
	}
	rows := []row{
		{fmt.Sprintf("failover: cut -> endpoints gone from all rules (%d runs)", failoverRuns), f.rulesGone},
		{fmt.Sprintf("failover: cut -> %d replicas ready again (%d runs)", failoverReplicas, failoverRuns), f.replaced},
	}
	for _, s := range rolloutStrategies {
		rows = append(rows, row{fmt.Sprintf("rolling update, %d replicas, %s (%d runs)", rolloutReplicas, s.label, rolloutRuns), f.rollout[s.label]})
	}
	width := 0
	for _, r := range rows {
		width = max(width, len(r.label))
	}
	fmt.Printf("Starling cluster benchmark (%d nodes, real containerd, echo image, readiness probe every 1s)\n", clusterNodes)
	fmt.Printf("%-*s  %-9s %-9s %s\n", width, "figure", "median", "min", "max")
	for _, r := range rows {
		med, lo, hi := stats(r.ds)
		fmt.Printf("%-*s  %-9s %-9s %s\n", width, r.label, med, lo, hi)
	}
	fmt.Printf("failure detection: %s (memberlist LAN defaults)\n", strings.Join(detection, " "))
	fmt.Printf("polled every %v; load average (1 min) %s before, %s after, %d cores\n", pollInterval, loadBefore, loadAfter, runtime.NumCPU())
	fmt.Printf("command: go run ./test/bench -only cluster -failover-runs %d -rollout-runs %d\n", failoverRuns, rolloutRuns)
}
