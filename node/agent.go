package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/podnet"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/runtime"
	"github.com/starling-orchestrator/starling/node/store"
)

// Agent is one Starling node: it stores desired state, reconciles its
// replicas against containerd and serves the API.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	store   *store.Store
	clock   *hlc.Clock
	net     *podnet.Network
	rt      *runtime.Runtime
	metrics *metrics
	token   string
	started time.Time

	kick chan struct{} // coalesced request to reconcile now

	mu   sync.Mutex
	busy map[string]reconcile.ActionType // container IDs an action is working on
	wg   sync.WaitGroup                  // running actions
}

// New opens the store, connects to containerd and prepares the pod network
// in the agent's network namespace. Errors name the missing prerequisite
// and how to fix it.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Agent, error) {
	pod, cluster, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: log, clock: hlc.New(nil), kick: make(chan struct{}, 1),
		busy: map[string]reconcile.ActionType{}, started: time.Now(), metrics: newMetrics()}
	if cfg.TokenFile != "" {
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		if a.token = strings.TrimSpace(string(b)); len(a.token) < 16 {
			return nil, fmt.Errorf("--token-file %s: token must be at least 16 characters", cfg.TokenFile)
		}
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", cfg.DataDir, err)
	}
	a.net, err = podnet.New(podnet.Config{DataDir: cfg.DataDir, PodSubnet: pod, ClusterCIDR: cluster, PluginDirs: cfg.CNIPluginDirs})
	if err != nil {
		return nil, err
	}
	if err := a.net.PrepareHost(); err != nil {
		return nil, fmt.Errorf("prepare pod network: %w", err)
	}
	a.rt, err = runtime.New(ctx, runtime.Config{Address: cfg.ContainerdAddress, Node: cfg.Name,
		LogDir: cfg.DataDir + "/logs", Snapshotter: cfg.Snapshotter}, a.net, log)
	if err != nil {
		return nil, err
	}
	a.store, err = store.Open(cfg.DataDir + "/store")
	if err != nil {
		a.rt.Close()
		return nil, fmt.Errorf("open store in %s: %w", cfg.DataDir, err)
	}
	return a, nil
}

// Run reconciles and serves the API until ctx is cancelled, then waits
// for running actions and closes the store. Containers keep running.
func (a *Agent) Run(ctx context.Context) error {
	defer a.close()
	handler := a.handler()
	sock := SocketPath(a.cfg.DataDir)
	os.Remove(sock)
	ul, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("API socket %s: %w", sock, err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ul.Close()
		return err
	}
	servers := []*http.Server{{Handler: handler}}
	listeners := []net.Listener{ul}
	if a.cfg.APIListen != "" {
		tl, err := net.Listen("tcp", a.cfg.APIListen)
		if err != nil {
			ul.Close()
			return fmt.Errorf("--api-listen %s: %w", a.cfg.APIListen, err)
		}
		servers = append(servers, &http.Server{Handler: a.requireToken(handler), ReadHeaderTimeout: 10 * time.Second})
		listeners = append(listeners, tl)
	}
	errc := make(chan error, len(servers))
	for i := range servers {
		go func(s *http.Server, l net.Listener) {
			if err := s.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}(servers[i], listeners[i])
	}
	a.log.Info("agent started", "node", a.cfg.Name, "socket", sock, "api", a.cfg.APIListen,
		"podSubnet", a.cfg.PodSubnet, "containerd", a.cfg.ContainerdAddress)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a.loop(ctx) }()
	go func() { defer wg.Done(); a.rt.WatchExits(ctx, a.requestReconcile) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	cancel()
	shutdownCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer stop()
	for _, s := range servers {
		s.Shutdown(shutdownCtx)
	}
	wg.Wait()
	return err
}

func (a *Agent) close() {
	a.wg.Wait()
	a.store.Close()
	a.rt.Close()
}

// requestReconcile asks the loop to run now (coalesced).
func (a *Agent) requestReconcile() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// loop runs reconcile on every store change, every kick, when a restart
// backoff expires, and every ResyncInterval.
func (a *Agent) loop(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.store.Changed():
		case <-a.kick:
		case <-timer.C:
		}
		requeue := a.reconcile(ctx)
		wait := a.cfg.ResyncInterval
		if requeue > 0 && requeue < wait {
			wait = requeue
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// desired reads the replicas this node should run from the store.
func (a *Agent) desired() ([]reconcile.Replica, error) {
	recs, err := a.store.List(kindPrefix(manifest.KindDeployment))
	if err != nil {
		return nil, err
	}
	objs, bad := liveObjects(recs)
	for _, k := range bad {
		a.log.Error("stored object does not decode; skipped", "key", k)
	}
	return desiredReplicas(objs), nil
}

// reconcile runs one pass: observe, Plan, and start the actions whose
// containers are not already being worked on. It returns Plan's requeue.
func (a *Agent) reconcile(ctx context.Context) time.Duration {
	start := time.Now()
	defer func() { a.metrics.reconcileSeconds.Observe(time.Since(start).Seconds()) }()
	desired, err := a.desired()
	if err != nil {
		a.log.Error("reconcile: read desired state", "err", err)
		return 0
	}
	observed, err := a.rt.List(ctx)
	if err != nil {
		a.log.Error("reconcile: observe containers", "err", err)
		return 0
	}
	a.metrics.observe(observed)
	res := reconcile.Plan(desired, observed, time.Now())
	for _, act := range res.Actions {
		if !a.claim(act) {
			continue
		}
		a.wg.Add(1)
		go a.execute(ctx, act)
	}
	if err := a.rt.CleanupSandboxes(ctx, observed, a.isBusy); err != nil {
		a.log.Warn("reconcile: sandbox cleanup", "err", err)
	}
	return res.Requeue
}

// claim marks the action's containers busy; false if one already is.
func (a *Agent) claim(act reconcile.Action) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range act.IDs() {
		if _, ok := a.busy[id]; ok {
			return false
		}
	}
	for _, id := range act.IDs() {
		a.busy[id] = act.Type
	}
	return true
}

func (a *Agent) isBusy(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.busy[id]
	return ok
}

func (a *Agent) busyAction(id string) (reconcile.ActionType, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.busy[id]
	return t, ok
}

func (a *Agent) execute(ctx context.Context, act reconcile.Action) {
	defer a.wg.Done()
	defer func() {
		a.mu.Lock()
		for _, id := range act.IDs() {
			delete(a.busy, id)
		}
		a.mu.Unlock()
		a.requestReconcile()
	}()
	start := time.Now()
	name := act.Replica.Name
	if name == "" {
		name = act.Old.Name
	}
	if err := a.rt.Execute(ctx, act); err != nil {
		a.log.Error("action failed", "action", act.Type, "replica", name, "reason", act.Reason, "err", err)
		a.metrics.actionErrors.WithLabelValues(string(act.Type)).Inc()
		return
	}
	if act.Type == reconcile.Start && act.Old.State == reconcile.StateExited {
		a.metrics.restarts.Inc()
	}
	a.log.Info("action done", "action", act.Type, "replica", name, "reason", act.Reason, "took", time.Since(start).Round(time.Millisecond))
}

// metrics are the agent's Prometheus metrics, in their own registry.
type metrics struct {
	reg              *prometheus.Registry
	reconcileSeconds prometheus.Histogram
	replicas         *prometheus.GaugeVec
	restarts         prometheus.Counter
	actionErrors     *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		reconcileSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "starling_reconcile_duration_seconds", Help: "Time of one reconcile pass (observe, plan, dispatch).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "starling_replicas", Help: "Replicas on this node by phase."}, []string{"phase"}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "starling_replica_restarts_total", Help: "Containers restarted after they exited."}),
		actionErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "starling_reconcile_action_errors_total", Help: "Reconcile actions that failed, by action."}, []string{"action"}),
	}
	m.reg.MustRegister(m.reconcileSeconds, m.replicas, m.restarts, m.actionErrors,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(cs []reconcile.Container) {
	counts := map[reconcile.State]int{reconcile.StateRunning: 0, reconcile.StateExited: 0, reconcile.StateCreated: 0, reconcile.StateUnknown: 0}
	for _, c := range cs {
		counts[c.State]++
	}
	for s, n := range counts {
		m.replicas.WithLabelValues(string(s)).Set(float64(n))
	}
}
