package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/ipam"
	"github.com/starling-orchestrator/starling/net/podnet"
	"github.com/starling-orchestrator/starling/net/route"
	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/preflight"
	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/runtime"
	"github.com/starling-orchestrator/starling/node/store"
	"github.com/starling-orchestrator/starling/placement"
)

// Agent is one Starling node: it stores desired state, reconciles its
// replicas against containerd and serves the API.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	store   *store.Store
	clock   *hlc.Clock
	rt      Runtime
	metrics *metrics
	token   string
	started time.Time

	kick chan struct{} // coalesced request to reconcile now

	cluster  *gossip.Cluster
	capacity placement.Resources
	// views is the node's one view of the cluster (snapshot.go); local
	// the list of its own replicas its last reconcile pass published.
	views *views
	local atomic.Pointer[[]api.Replica]
	// id is this node's identity (identity.go): it signs every record
	// the node writes and knows which key each node name is bound to.
	id *identity
	// trust holds the cluster's credentials and this node's certificate
	// (pki.go, peertls.go), join admits new nodes (join.go) and keys
	// rotates the gossip key (keys.go); all three nil with --insecure.
	trust *trust
	join  *admission
	keys  *keyring
	// acks tracks nodes that do not list the replicas placed on them.
	acks *ackTracker
	// clusterCIDR is --cluster-cidr; rejects checks what peers send.
	clusterCIDR netip.Prefix
	rejects     *rejects
	synced      chan struct{} // closed once the node holds the cluster's state
	syncOnce    sync.Once

	// syncRoutes applies routes to peers' pod subnets (route.Sync); nil in
	// in-process tests, which must not touch the host's routes.
	syncRoutes func([]route.Route) (route.Change, error)

	// useSubnet configures the pod network for the claimed subnet; nil in
	// in-process tests.
	useSubnet func(*net.IPNet) error
	// subnet is the claimed pod subnet; subnetReady is closed once the
	// claim has settled and the pod network uses it.
	subnet      ipam.Claim
	subnetMu    sync.Mutex
	subnetReady chan struct{}

	// services syncs Service rules (net/service); nil in in-process tests.
	services      *service.Syncer
	masqueradeAll bool

	// droppedState is set when the node was away longer than the
	// tombstone TTL and discarded its desired state.
	droppedState bool

	// Owned by the reconcile loop goroutine.
	handoffs   map[string]time.Time
	lastStatus string

	// acts is the bookkeeping of actions: busy containers, epochs,
	// failures (actions.go).
	acts *actions

	mu sync.Mutex
	// Probe statuses of container runs by probeKey, and the containers
	// the last reconcile observed (the prober's input).
	probes       map[string]probe.Status
	lastObserved []reconcile.Container
	// atMostOne are the container IDs of this node's StatefulSet
	// replicas, for the fence lease (watchdog.go).
	atMostOne []string
	// leaseMu serialises lease renewals; leased are the IDs the last
	// lease named.
	leaseMu sync.Mutex
	leased  []string
	// Flap damping (see aliveMembers): members seen down, and when the
	// ones that came back did.
	memberDown map[string]time.Time // since when
	// quorum is the last quorum state logged; peerAcks are the peers'
	// answers to quorum pings (quorumLoop); pinged is closed after the
	// first round of pings.
	quorum bool
	// selfBack is when this node came back to the cluster after its
	// agent did not run for longer than --fence-timeout (stopped,
	// starved: the ping loop saw the gap, or its fence lease ran out
	// while a renewal was due). For --rejoin-settle after
	// it, its view of who runs which StatefulSet replica is stale, so it
	// starts none (quorum Unknown: what runs is kept).
	selfBack time.Time
	// leaseDeadline is the deadline of the last fence lease written
	// (watchdog.go); zero when none is pending.
	leaseDeadline time.Time
	peerAcks      peerAcks
	pinged        chan struct{}
	memberBack    map[string]time.Time
	wg            sync.WaitGroup // running actions
}

// Runtime is what the agent needs from the container runtime. node/runtime
// implements it with containerd; in-process tests use a fake.
type Runtime interface {
	// List observes every managed container.
	List(ctx context.Context) ([]reconcile.Container, error)
	// Execute carries out one reconcile action.
	Execute(ctx context.Context, a reconcile.Action) error
	// CleanupSandboxes removes sandboxes without a container, except busy ones.
	CleanupSandboxes(ctx context.Context, observed []reconcile.Container, claim func(id string) (release func(), ok bool)) error
	// WatchExits calls onExit when a container's task exits, until ctx ends.
	WatchExits(ctx context.Context, onExit func())
	// Exec runs argv inside container id's running task and returns its
	// exit status and the start of its output; it kills the command after
	// timeout (counted from its start; the error wraps
	// context.DeadlineExceeded). runtime.ErrNotRunning (wrapped) when
	// there is no running task.
	Exec(ctx context.Context, id string, argv []string, timeout time.Duration) (exitCode int, output string, err error)
	// LogPath is the log file of a container; PreviousLogPath that of its
	// previous run.
	LogPath(id string) string
	PreviousLogPath(id string) string
	// CgroupPath is the cgroup of a container (as in its OCI spec).
	CgroupPath(id string) string
	ImportImages(ctx context.Context, tar io.Reader) ([]string, error)
	Images(ctx context.Context) ([]api.Image, error)
	// WriteBlob writes content blob d to w, calling size first (a peer
	// pulling an image); errdefs.ErrNotFound when the node lacks it.
	WriteBlob(ctx context.Context, d digest.Digest, size func(int64), w io.Writer) error
	HasImage(ctx context.Context, ref string) bool
	// ImageDigest is the digest of image ref's manifest or index.
	ImageDigest(ctx context.Context, ref string) (string, error)
	// ImageProgress says how a fetch of image ref from a peer goes ("":
	// none in flight).
	ImageProgress(ref string) string
	Close() error
}

// New checks the host's prerequisites (a *preflight.Error lists every
// missing one with its fix), opens the store, connects to containerd,
// prepares the pod network in the agent's network namespace and starts
// gossip. With cfg.DryRun it needs no prerequisite (missing ones are
// printed) and never connects to containerd (see dryrun.go).
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Agent, error) {
	pod, cluster, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	// Every prerequisite is checked, and all missing ones reported
	// together, before anything on the host changes.
	checkErr := preflight.Run(&preflight.System{}, preflight.Config{ContainerdAddress: cfg.ContainerdAddress, CNIPluginDirs: cfg.CNIPluginDirs})
	if cfg.DryRun {
		a, err := newAgent(ctx, cfg, log, dryRuntime{})
		if err != nil {
			return nil, err
		}
		if checkErr != nil {
			fmt.Fprint(a.dryRunOut(), comment(time.Now(), "a real start would refuse: "+checkErr.Error()))
			log.Warn("dry run: host prerequisites missing (listed on stdout); a real start would refuse")
		}
		return a, nil
	}
	if checkErr != nil {
		return nil, checkErr
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", cfg.DataDir, err)
	}
	pn, err := podnet.New(podnet.Config{DataDir: cfg.DataDir, PodSubnet: pod, ClusterCIDR: cluster, PluginDirs: cfg.CNIPluginDirs})
	if err != nil {
		return nil, err
	}
	if cfg.RuncRoot == "" {
		cfg.RuncRoot = "/run/starling/" + cfg.Name + "/runc"
	}
	var a *Agent
	fetch := func(ctx context.Context, ref string) (string, []runtime.ImageSource, error) {
		return a.imageSources(ctx, ref)
	}
	rt, err := runtime.New(ctx, runtime.Config{Address: cfg.ContainerdAddress, Node: cfg.Name, RuncRoot: cfg.RuncRoot, CgroupParent: cfg.CgroupParent,
		LogDir: cfg.DataDir + "/logs", PodDir: cfg.DataDir + "/pods", PidsLimit: cfg.PidsLimit,
		LogDriver: cfg.LogDriver, LogMaxSize: cfg.LogMaxSize, LogMaxFiles: cfg.LogMaxFiles, Snapshotter: cfg.Snapshotter, FetchImage: fetch}, pn, log)
	if err != nil {
		return nil, err
	}
	a, err = newAgent(ctx, cfg, log, rt)
	if err != nil {
		rt.Close()
		return nil, err
	}
	a.syncRoutes = route.Sync
	if a.services, err = service.NewSyncer(); err != nil {
		rt.Close()
		return nil, err
	}
	// The network namespace is touched only once the subnet is claimed.
	a.useSubnet = func(subnet *net.IPNet) error {
		if err := pn.SetSubnet(subnet); err != nil {
			return err
		}
		if err := pn.PrepareHost(); err != nil {
			return fmt.Errorf("prepare pod network: %w", err)
		}
		return nil
	}
	return a, nil
}

// newAgent builds an agent on a given runtime: it reads the token, sets up
// the node's identity and cluster credentials (joining with a token if it
// has none: setupCredentials), opens the store and starts gossip. On error
// it closes nothing of rt's.
func newAgent(ctx context.Context, cfg Config, log *slog.Logger, rt Runtime) (*Agent, error) {
	_, cluster, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	log = log.With("node", cfg.Name)
	a := &Agent{cfg: cfg, log: log, rt: rt, clock: hlc.New(nil), kick: make(chan struct{}, 1),
		acts: newActions(), probes: map[string]probe.Status{},
		memberDown: map[string]time.Time{}, peerAcks: newPeerAcks(), pinged: make(chan struct{}), memberBack: map[string]time.Time{}, started: time.Now(), metrics: newMetrics(),
		synced: make(chan struct{}), views: newViews(), subnetReady: make(chan struct{}), handoffs: map[string]time.Time{}, capacity: capacity()}
	a.clusterCIDR = prefixOf(cluster)
	a.acks = newAckTracker(cfg.AckTimeout)
	if cfg.TokenFile != "" {
		b, err := readSecretFile("--token-file", cfg.TokenFile)
		if err != nil {
			return nil, err
		}
		if a.token = strings.TrimSpace(string(b)); len(a.token) < 16 {
			return nil, fmt.Errorf("--token-file %s: token must be at least 16 characters", cfg.TokenFile)
		}
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", cfg.DataDir, err)
	}
	key, err := loadOrCreateNodeKey(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	creds, err := setupCredentials(ctx, cfg, key, log)
	if err != nil {
		return nil, err
	}
	a.store, err = store.Open(cfg.DataDir + "/store")
	if err != nil {
		return nil, fmt.Errorf("open store in %s: %w", cfg.DataDir, err)
	}
	a.id = &identity{name: cfg.Name, key: key, store: a.store}
	if creds != nil {
		a.trust = newTrust(creds, key, a.id)
	}
	a.rejects = newRejects(a.clusterCIDR, creds, a.id.boundKey, a.id.isRevoked, a.id.keyOwner, log, a.metrics.rejectedRecords)
	a.rejects.setHeld(a.heldStatus, a.heldStatuses, a.claimReserved)
	if err := a.startGossip(); err != nil {
		a.store.Close()
		return nil, err
	}
	if a.trust != nil {
		a.join = &admission{store: a.store, id: a.id, trust: a.trust, clock: a.clock, self: cfg.Name,
			publish: a.publish, keys: a.cluster.Keys, log: log}
		a.keys = &keyring{cluster: a.cluster, trust: a.trust, dataDir: cfg.DataDir, self: cfg.Name, log: log}
	}
	return a, nil
}

// startGossip checks the node's identity and the age of its state, then
// starts memberlist (without joining; Run does that).
func (a *Agent) startGossip() error {
	if err := a.checkIdentity(); err != nil {
		return err
	}
	if a.staleState() {
		if len(a.joinTargets()) == 0 {
			a.log.Warn("state is older than --tombstone-ttl but there is no peer to resync from; keeping it")
		} else {
			a.log.Warn("this node was away longer than --tombstone-ttl: discarding its desired state and resyncing from peers", "ttl", a.cfg.TombstoneTTL)
			if err := a.store.DropRecords(); err != nil {
				return err
			}
			a.droppedState = true
		}
	}
	host, port, err := splitHostPort(a.cfg.BindAddr, 7946)
	if err != nil {
		return fmt.Errorf("--bind %q: %w", a.cfg.BindAddr, err)
	}
	gc := gossip.DefaultConfig()
	gc.Name, gc.BindAddr, gc.BindPort = a.cfg.Name, host, port
	if a.cfg.Advertise != "" {
		ahost, aport, err := splitHostPort(a.cfg.Advertise, port)
		if err != nil {
			return fmt.Errorf("--advertise %q: %w", a.cfg.Advertise, err)
		}
		gc.AdvertiseAddr, gc.AdvertisePort = ahost, aport
	}
	if a.trust != nil {
		keys := a.trust.creds.GossipKeys
		gc.SecretKey, gc.ExtraKeys = keys[0], keys[1:]
	}
	gc.Logger = a.log.With("component", "gossip")
	// Hybrid logical clock: every received version advances the clock, and
	// so does every version already stored (a restarted node, or one whose
	// wall clock is behind, still writes versions that win over what it has
	// seen: a delete after an apply is never older than the apply).
	gc.Clock = a.clock
	gc.Accept = a.rejects.check
	if all, err := a.store.Snapshot(); err == nil {
		for _, r := range all {
			a.clock.Update(r.Version)
		}
	}
	if a.cfg.ProbeInterval > 0 {
		gc.ProbeInterval = a.cfg.ProbeInterval
	}
	if a.cfg.ProbeTimeout > 0 {
		gc.ProbeTimeout = a.cfg.ProbeTimeout
	}
	if a.cfg.SuspicionMult > 0 {
		gc.SuspicionMult = a.cfg.SuspicionMult
	}
	if a.cfg.tuneGossip != nil {
		a.cfg.tuneGossip(&gc)
	}
	a.cluster, err = gossip.New(gc, a.store)
	if err != nil {
		return fmt.Errorf("start gossip on %s: %w", a.cfg.BindAddr, err)
	}
	a.rejects.setLive(func(name string) bool {
		for _, m := range a.cluster.Members() {
			if m.Name == name {
				return m.State.Up()
			}
		}
		return false
	})
	return nil
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
		if a.trust != nil {
			// TLS with the node's certificate; clients check it against
			// the cluster CA's pin (starling config).
			tl = tls.NewListener(tl, &tls.Config{MinVersion: tls.VersionTLS12,
				GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return a.trust.tlsCert(), nil }})
		}
		servers = append(servers, &http.Server{Handler: a.requireAuth(handler), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute})
		listeners = append(listeners, tl)
	}
	if a.trust != nil {
		pl, err := a.listenPeers()
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return err
		}
		servers = append(servers, &http.Server{Handler: a.peerHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute})
		listeners = append(listeners, pl)
	}
	errc := make(chan error, len(servers))
	for i := range servers {
		go func(s *http.Server, l net.Listener) {
			if err := s.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}(servers[i], listeners[i])
	}
	a.log.Info("agent started", "socket", sock, "api", a.cfg.APIListen,
		"containerd", a.cfg.ContainerdAddress, "dryRun", a.cfg.DryRun)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.rebuildView(time.Now())
	loops := []func(context.Context){a.viewLoop, a.joinLoop, a.watchMembership, a.insecureWarnLoop,
		func(ctx context.Context) { a.keys.refreshLoop(ctx, a.joinTargets) }}
	if a.trust != nil {
		loops = append(loops, func(ctx context.Context) {
			a.trust.renewLoop(ctx, a.cfg.DataDir, advertisedIPs(a.cfg), a.log, a.requestReconcile)
		})
	}
	if a.cfg.DryRun {
		// No reconcile, probes, routes or Service rules: only printing.
		loops = append(loops, a.dryRunLoop)
	} else {
		loops = append(loops, a.quorumLoop, a.leaseLoop, a.proberLoop, a.serviceLoop, a.routeLoop, a.loop,
			func(ctx context.Context) { a.rt.WatchExits(ctx, a.requestReconcile) })
	}
	var wg sync.WaitGroup
	for _, f := range loops {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
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
	if a.isSynced() {
		a.markSeen()
	}
	if !a.cfg.DryRun {
		a.stopStatefulReplicas()
	}
	// A clean stop leaves the cluster: peers see "left", not "dead".
	if lerr := a.cluster.Leave(5 * time.Second); lerr != nil {
		a.log.Warn("leave cluster", "err", lerr)
	}
	return err
}

func (a *Agent) close() {
	a.wg.Wait()
	// After Leave this is a no-op; on an early return it stops memberlist
	// before the store it writes to is closed.
	a.cluster.Shutdown()
	a.store.Close()
	a.rt.Close()
}

// insecureWarnInterval is how often an agent without a gossip key says so.
const insecureWarnInterval = 10 * time.Minute

// insecureWarnLoop logs, at start and every insecureWarnInterval, that
// this node runs with --insecure.
func (a *Agent) insecureWarnLoop(ctx context.Context) {
	if !a.cfg.Insecure {
		return
	}
	t := time.NewTicker(insecureWarnInterval)
	defer t.Stop()
	for {
		a.log.Warn("running with --insecure: gossip is not encrypted or authenticated; anyone on the LAN can read this cluster's state and write to it. Create a secure cluster: start the first agent without --insecure and join the others with 'starling join-token'")
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
	// Acting on state that may be stale would resurrect deleted objects:
	// wait for the first sync with the cluster; and pods need the subnet.
	select {
	case <-ctx.Done():
		return
	case <-a.synced:
	}
	if !a.claimSubnet(ctx) {
		return
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	changed := a.views.changed()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-a.kick:
		case <-timer.C:
		}
		// Taken before the pass reads the view: a snapshot stored while
		// the pass runs wakes the next one.
		changed = a.views.changed()
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

// reconcile runs one pass: read the cluster view, decide what this node
// owns (placement plus make-before-break handoffs), observe, Plan, and
// start the actions whose containers are not already being worked on. It
// publishes this node's status and returns Plan's requeue.
func (a *Agent) reconcile(ctx context.Context) time.Duration {
	start := time.Now()
	defer func() { a.metrics.reconcileSeconds.Observe(time.Since(start).Seconds()) }()
	v := a.view()
	listed := a.acts.listEpoch()
	observed, err := a.rt.List(ctx)
	if err != nil {
		a.log.Error("reconcile: observe containers", "err", err)
		return 0
	}
	a.metrics.observe(observed)
	a.markUnhealthy(observed)
	a.mu.Lock()
	a.lastObserved = observed
	a.mu.Unlock()
	out := reconcile.Decide(a.decision(v, observed, a.handoffs, start), time.Now())
	mine := out.Mine
	a.setAtMostOne(atMostOneIDs(v, observed, mine))
	a.handoffs = out.Handoffs
	a.acts.pruneFailures(mine, observed)
	res := reconcile.Result{Actions: out.Actions, Requeue: out.Requeue}
	a.withServiceLinks(v, res.Actions)
	for _, act := range res.Actions {
		if wait := a.acts.failureWait(act, time.Now()); wait > 0 {
			if res.Requeue == 0 || wait < res.Requeue {
				res.Requeue = wait
			}
			continue
		}
		if !a.acts.claim(act, listed) {
			continue
		}
		a.wg.Add(1)
		go a.execute(ctx, act)
	}
	claimID := func(id string) (func(), bool) { return a.acts.claimID(id, listed) }
	if err := a.rt.CleanupSandboxes(ctx, observed, claimID); err != nil {
		a.log.Warn("reconcile: sandbox cleanup", "err", err)
	}
	a.publishStatus(a.localReplicas(observed, mine, a.probeSpecs(v, observed)))
	requeue := res.Requeue
	if a.acts.creating() && (requeue == 0 || requeue > time.Second) {
		requeue = time.Second // the progress of image transfers goes into the status every second
	}
	return requeue
}

// actionTimeout bounds one action: image pulls make creates slow; a stop
// waits the grace period first.
func actionTimeout(act reconcile.Action) time.Duration {
	switch act.Type {
	case reconcile.Remove, reconcile.Stop:
		return act.Old.GracePeriod + time.Minute
	case reconcile.Start:
		return 2 * time.Minute
	default:
		return act.Old.GracePeriod + 10*time.Minute
	}
}

func (a *Agent) execute(ctx context.Context, act reconcile.Action) {
	defer a.wg.Done()
	defer func() {
		a.acts.finish(act)
		a.requestReconcile()
	}()
	start := time.Now()
	name := act.Replica.Name
	if name == "" {
		name = act.Old.Name
	}
	// A stuck registry, peer or containerd call must not hold the replica
	// busy forever: every action has a deadline.
	ctx, cancel := context.WithTimeout(ctx, actionTimeout(act))
	defer cancel()
	if d := a.drainDelay(act); d > 0 {
		// The replica is already published as Terminating (not ready):
		// give every node time to take it out of its Service rules
		// before SIGTERM, so no new connection meets a closed port.
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	if err := a.rt.Execute(ctx, act); err != nil {
		if errors.Is(err, runtime.ErrTaskRunning) {
			// Planned on a list that missed a start (claim guards the
			// agent's own actions; this guards the rest): nothing done.
			a.log.Warn("start skipped: the task already runs", "replica", name, "reason", act.Reason)
			return
		}
		f := a.acts.recordFailure(act, err, time.Now())
		a.log.Error("action failed", "action", act.Type, "replica", name, "reason", act.Reason, "err", err,
			"failures", f.count, "retryIn", time.Until(f.until).Round(time.Millisecond))
		a.metrics.actionErrors.WithLabelValues(string(act.Type)).Inc()
		return
	}
	a.acts.clearFailure(act)
	if act.Type == reconcile.Start && act.Old.State == reconcile.StateExited {
		a.metrics.restarts.Inc()
	}
	a.log.Info("action done", "action", act.Type, "replica", name, "reason", act.Reason, "took", time.Since(start).Round(time.Millisecond))
}

// drainDelay is how long act waits before stopping a running container:
// --drain-delay for a remove or replace of a running container with a
// grace period; none for a fenced StatefulSet replica (killed at once), a
// liveness stop, or a container that is not running.
func (a *Agent) drainDelay(act reconcile.Action) time.Duration {
	if (act.Type != reconcile.Remove && act.Type != reconcile.Replace) || act.Old.State != reconcile.StateRunning || act.Old.GracePeriod == 0 {
		return 0
	}
	return a.cfg.DrainDelay
}

// prefixOf converts a parsed IPv4 network to a netip.Prefix (the zero
// Prefix for nil).
func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	addr, ok := netip.AddrFromSlice(n.IP.To4())
	if !ok {
		return netip.Prefix{}
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addr, ones).Masked()
}
