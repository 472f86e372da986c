package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/sealed"
	"github.com/starling-orchestrator/starling/node/trust"
	"github.com/starling-orchestrator/starling/node/volumes"

	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/net/ipam"
	"github.com/starling-orchestrator/starling/net/podnet"
	"github.com/starling-orchestrator/starling/net/route"
	"github.com/starling-orchestrator/starling/node/dataplane"
	"github.com/starling-orchestrator/starling/node/preflight"
	"github.com/starling-orchestrator/starling/node/probe"
	"github.com/starling-orchestrator/starling/node/runtime"
	"github.com/starling-orchestrator/starling/node/store"
	"github.com/starling-orchestrator/starling/node/view"
)

// Agent is one Starling node. It holds the node's shared pieces (the
// store, the clock, the runtime, metrics, the view of the cluster) and
// its parts grouped by role, each part owning its own state: guard (who
// may say what), mem (membership), own (this node's record and subnet),
// work (the controllers of its replicas), network (routes and Service
// rules) and api (what the API serves; package apiserver). Every field
// is set in New; its own methods are construction (agent.go, gossip.go,
// hostnet.go), Run and its loops' start and stop, publishing signed
// records, the disk watch (disk.go) and the API's listeners (serve.go).
type Agent struct {
	cfg     Config
	log     *slog.Logger
	started time.Time
	store   *tracked
	clock   *hlc.Clock
	rt      Runtime
	metrics *metrics
	views   *view.Builder

	guard   guard
	mem     membership
	own     ownParts
	work    workloads
	network network
	api     apiParts
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
	host := &preflight.System{}
	checkErr := preflight.Run(host, preflight.Config{ContainerdAddress: cfg.ContainerdAddress, CNIPluginDirs: cfg.CNIPluginDirs})
	svcCIDR, _ := netip.ParsePrefix(cfg.ServiceCIDR) // validated above
	for _, w := range preflight.Warnings(host, preflight.Config{DataDir: cfg.DataDir, ServiceCIDR: svcCIDR}) {
		log.Warn("preflight: "+w.What, "fix", w.Fix)
	}
	if cfg.DryRun {
		a, err := newAgent(ctx, cfg, hooks{}, log, dryRuntime{}, nil)
		if err != nil {
			return nil, err
		}
		if checkErr != nil {
			fmt.Fprint(a.network.dry.print.out, comment(time.Now(), "a real start would refuse: "+checkErr.Error()))
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
	ipt := dataplane.IptablesBackend(ctx, log)
	pn, err := podnet.New(podnet.Config{DataDir: cfg.DataDir, PodSubnet: pod, ClusterCIDR: cluster, PluginDirs: cfg.CNIPluginDirs, Iptables: ipt.Iptables})
	if err != nil {
		return nil, err
	}
	if cfg.RuncRoot == "" {
		cfg.RuncRoot = "/run/starling/" + cfg.Name + "/runc"
	}
	var a *Agent
	fetch := func(ctx context.Context, ref string) (string, []runtime.ImageSource, error) {
		return a.work.images.sources(ctx, ref)
	}
	rt, err := runtime.New(ctx, runtime.Config{Address: cfg.ContainerdAddress, Node: cfg.Name, RuncRoot: cfg.RuncRoot, CgroupParent: cfg.CgroupParent,
		LogDir: cfg.DataDir + "/logs", PodDir: cfg.DataDir + "/pods", ClaimDir: cfg.DataDir + "/volumes", PidsLimit: cfg.PidsLimit, AllowHostPath: cfg.AllowHostPath, InsecureRegistries: cfg.InsecureRegistries,
		LogDriver: cfg.LogDriver, LogMaxSize: cfg.LogMaxSize, LogMaxFiles: cfg.LogMaxFiles, Snapshotter: cfg.Snapshotter, FetchImage: fetch,
		ResolvConf: cfg.ResolvConf, ClusterDomain: cfg.clusterDNSDomain(pn != nil), PodSubnetBits: ipam.SubnetBits}, pn, log)
	if err != nil {
		return nil, err
	}
	syncer, err := dataplane.ServiceSyncer(ctx, cfg.ProxyMode, ipt, log)
	if err != nil {
		rt.Close()
		return nil, err
	}
	hn := hostNetwork{
		routes: route.Sync,
		rules:  syncer,
		// The network namespace is touched only once the subnet is claimed.
		useSubnet: func(subnet *net.IPNet) error {
			if err := pn.SetSubnet(subnet); err != nil {
				return err
			}
			if err := pn.PrepareHost(); err != nil {
				return fmt.Errorf("prepare pod network: %w", err)
			}
			return nil
		},
		keepHost: pn.KeepHost,
	}
	if a, err = newAgent(ctx, cfg, hooks{}, log, rt, &hn); err != nil {
		rt.Close()
		return nil, err
	}
	return a, nil
}

// newAgent builds an agent on a given runtime and host network (nil:
// none): it reads the token, sets up the node's identity and cluster
// credentials (joining with a token if it has none: setupCredentials),
// opens the store, starts gossip and wires the parts. On error it closes
// nothing of rt's.
func newAgent(ctx context.Context, cfg Config, h hooks, log *slog.Logger, rt Runtime, hn *hostNetwork) (*Agent, error) {
	_, cluster, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	log = log.With("node", cfg.Name)
	a := &Agent{cfg: cfg, log: log, rt: rt, clock: hlc.New(nil), started: time.Now(), metrics: newMetrics()}
	if cfg.TokenFile != "" {
		b, err := trust.ReadSecretFile("--token-file", cfg.TokenFile)
		if err != nil {
			return nil, err
		}
		if a.api.token = strings.TrimSpace(string(b)); len(a.api.token) < 16 {
			return nil, fmt.Errorf("--token-file %s: token must be at least 16 characters", cfg.TokenFile)
		}
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", cfg.DataDir, err)
	}
	key, err := trust.LoadOrCreateNodeKey(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	creds, key, err := setupCredentials(ctx, cfg, key, log)
	if err != nil {
		return nil, err
	}
	if h.store != nil {
		a.store = track(h.store)
	} else {
		disk, err := store.Open(cfg.DataDir + "/store")
		if err != nil {
			return nil, fmt.Errorf("open store in %s: %w", cfg.DataDir, err)
		}
		a.store = track(disk)
	}
	a.metrics.reg.MustRegister(storeMetrics(a.store)...)
	a.guard.id = &trust.Identity{Name: cfg.Name, Key: key, Store: a.store}
	if creds != nil {
		a.guard.trust = trust.NewTrust(creds, key, a.guard.id)
	}
	clusterCIDR := view.PrefixOf(cluster)
	claims := new(view.ClaimsFeed)
	refused := make(chan ipam.Claim, maxRivals) // the arrival check's refused takeovers, for the claim check
	a.guard.rejects = newRejects(clusterCIDR, creds, a.guard.id, claims, cfg.SubnetReclaimAfter, refused, log, a.metrics.rejectedRecords)
	dropped, err := a.startGossip(h.tuneGossip)
	if err != nil {
		a.store.Close()
		return nil, err
	}
	a.mem.writer = &writer{id: a.guard.id, cluster: a.mem.cluster, store: a.store}
	if a.guard.trust != nil {
		a.guard.join = &trust.Admission{Store: a.store, Id: a.guard.id, Trust: a.guard.trust, Clock: a.clock, Self: cfg.Name,
			Writer: a.mem.writer, Cluster: a.mem.cluster, Log: log}
		a.guard.keys = &trust.Keyring{Cluster: a.mem.cluster, Trust: a.guard.trust, DataDir: cfg.DataDir, Self: cfg.Name, Log: log,
			Sealed: &sealed.Resealer{Box: sealed.New(a.mem.cluster), Records: a.store, Writer: a.mem.writer, Clock: a.clock, Self: cfg.Name, Log: log}}
	}
	a.mem.members = newMembers(cfg, a.store, a.mem.cluster, a.guard.auth, a.guard.keys, dropped, log)
	a.wire(cfg, h, clusterCIDR, claims, refused, hn)
	return a, nil
}

// wire builds the agent's parts on its shared pieces.
func (a *Agent) wire(cfg Config, h hooks, clusterCIDR netip.Prefix, claims *view.ClaimsFeed, refused chan ipam.Claim, hn *hostNetwork) {
	log := a.log
	_, clusterNet, _ := net.ParseCIDR(cfg.ClusterCIDR)
	_, serviceNet, _ := net.ParseCIDR(cfg.ServiceCIDR)
	a.mem.acks = view.NewAckTracker(cfg.AckTimeout)
	a.own.subnets = &subnets{self: cfg.Name, fixed: cfg.PodSubnet, cluster: clusterNet, clusterCIDR: clusterCIDR, settle: cfg.SubnetSettle,
		reclaimAfter: cfg.SubnetReclaimAfter, askers: newAskers(cfg.SubnetSettle), store: a.store, clock: a.clock, gossip: a.mem.cluster, claims: claims, log: log, ready: make(chan struct{}), refused: refused,
		republish: make(chan struct{}, 1), use: hn.podNetwork(cfg.DryRun)}
	a.work.claims = &volumes.Binder{Self: cfg.Name, Dir: cfg.DataDir + "/volumes", Clock: a.clock, Republish: a.own.subnets.republish, Log: log}
	a.own.status = &self{name: cfg.Name, advertise: cfg.Advertise, apiListen: cfg.APIListen, labels: cfg.Labels, insecure: cfg.Insecure,
		capacity: capacity(), started: a.started, store: a.store, clock: a.clock, id: a.guard.id, trust: a.guard.trust, members: a.mem.members,
		subnets: a.own.subnets, writer: a.mem.writer, log: log, writes: a.metrics.statusWrites, claims: a.work.claims}
	a.views = view.NewBuilder(view.Config{Self: cfg.Name, Records: a.store, Membership: a.mem.cluster, Damping: a.mem.members, Acks: a.mem.acks,
		Checked: a.guard.rejects.checked, Claims: claims, ServiceCIDR: serviceNet, ClusterCIDR: clusterCIDR, Placements: a.metrics.placements, Builds: a.metrics.viewBuilds, Log: log,
		SelfStatus: a.own.status, Started: a.started, ReclaimAfter: cfg.SubnetReclaimAfter, RejoinSettle: cfg.RejoinSettle, Share: h.shareDecodes, Opener: sealed.New(a.mem.cluster)})
	wake := newWake()
	a.work.fence = newFence(cfg, a.started, a.mem.cluster, a.mem.members, a.guard.auth, a.metrics.uncertified, wake, log)
	a.work.lease = &lease{enabled: cfg.FenceWatchdog, dataDir: cfg.DataDir, cfg: cfg, rt: a.rt, fence: a.work.fence, log: log}
	a.work.volumes = &volumes.Updater{Self: cfg.Name, PodDir: cfg.DataDir + "/pods", Views: a.views, Pods: a.rt, Log: log}
	a.work.claims.Views = a.views
	a.work.replicas = &replicas{self: cfg.Name, resync: cfg.ResyncInterval, handoffTimeout: cfg.HandoffTimeout, drainDelay: cfg.DrainDelay,
		rt: a.rt, views: a.views, acts: newActions(), fence: a.work.fence, lease: a.work.lease, status: a.own.status, subnets: a.own.subnets,
		members: a.mem.members, metrics: a.metrics, log: log, wake: wake, handoffs: map[string]time.Time{}, evictions: a.work.volumes}
	a.work.probes = &prober{rt: a.rt, views: a.views, store: a.store, metrics: a.metrics, log: log, seed: readySeed(a.store, cfg.Name, a.guard.id.Public()),
		wake: a.work.replicas.wake, status: map[string]probe.Status{}}
	a.work.replicas.probes = a.work.probes
	a.api.peers = &peers{self: cfg.Name, trust: a.guard.trust, id: a.guard.id, cluster: a.mem.cluster}
	a.wireDataplane(cfg, clusterNet, clusterCIDR, hn, h.dryRunOut)
	a.api.objects = &objects{self: cfg.Name, serviceCIDR: cfg.ServiceCIDR, st: a.store, clock: a.clock, views: a.views, writer: a.mem.writer, box: sealed.New(a.mem.cluster), log: log}
	a.work.claims.Objects = a.api.objects
	if a.network.ingress != nil {
		a.network.ingress.Objects = a.api.objects
	}
	a.api.info = &info{self: cfg.Name, views: a.views, status: a.own.status, cluster: a.mem.cluster, store: a.store, clock: a.clock, id: a.guard.id,
		writer: a.mem.writer, join: a.guard.join, keys: a.guard.keys, certified: a.guard.auth, log: log}
	a.work.images = &images{self: cfg.Name, maxBytes: cfg.MaxImageBytes, rt: a.rt, store: a.store, clock: a.clock, views: a.views,
		cluster: a.mem.cluster, peers: a.api.peers, writer: a.mem.writer, wake: a.work.replicas.wake, log: log}
	a.work.logs = &logs{self: cfg.Name, rt: a.rt, views: a.views, replicas: a.work.replicas, peers: a.api.peers, log: log}
	a.mem.answerer.Store(a.work.fence)
	// The first view: from here on, the arrival check holds the claims
	// (view.ClaimsFeed) of the records this node kept.
	a.views.Rebuild(time.Now())
}

// Run reconciles and serves the API until ctx is cancelled, then waits
// for running actions and closes the store. Containers keep running.
func (a *Agent) Run(ctx context.Context) error {
	defer a.close()
	servers, listeners, err := a.listen()
	if err != nil {
		return err
	}
	a.log.Info("agent started", "socket", SocketPath(a.cfg.DataDir), "api", a.cfg.APIListen,
		"containerd", a.cfg.ContainerdAddress, "dryRun", a.cfg.DryRun)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg := a.start(ctx)
	err = serve(ctx, servers, listeners)
	cancel()
	wg.Wait()
	a.stop()
	return err
}

// start runs the agent's loops until ctx ends; the WaitGroup tells when
// they have.
func (a *Agent) start(ctx context.Context) *sync.WaitGroup {
	loops := []func(context.Context){a.views.Loop,
		func(ctx context.Context) { a.mem.members.joinLoop(ctx, a.views.Changed) },
		func(ctx context.Context) { a.mem.members.watch(ctx, a.views.Changed) },
		func(ctx context.Context) { a.mem.members.introduceLoop(ctx, a.views.Load) },
		a.insecureWarnLoop,
		func(ctx context.Context) { a.own.status.republishOn(ctx, a.own.subnets.republish) },
		func(ctx context.Context) { a.guard.keys.RefreshLoop(ctx, a.mem.members.targets) },
		a.network.routes.Run, a.network.services.Run, a.diskLoop, a.network.host.Run}
	if a.network.dns != nil {
		loops = append(loops, a.network.dns.Run)
	}
	if a.network.ingress != nil {
		loops = append(loops, a.network.ingress.Run)
	}
	if a.network.lb != nil {
		loops = append(loops, a.network.lb.Run)
	}
	if a.guard.trust != nil {
		loops = append(loops, func(ctx context.Context) {
			a.guard.trust.RenewLoop(ctx, a.cfg.DataDir, advertisedIPs(a.cfg), a.log, a.work.replicas.wake.kick)
		})
	}
	if a.network.dry != nil {
		// No reconcile or probes: only printing.
		loops = append(loops, a.network.dry.loop)
	} else {
		loops = append(loops, func(ctx context.Context) { a.work.fence.loop(ctx, a.mem.members.synced) }, a.work.lease.loop, a.work.probes.loop, a.work.replicas.loop, a.work.volumes.Run, a.work.claims.Run,
			func(ctx context.Context) { a.work.replicas.stopAllOn(ctx, a.mem.members.stopReplicas) },
			func(ctx context.Context) { a.rt.WatchExits(ctx, a.work.replicas.wake.kick) })
	}
	var wg sync.WaitGroup
	for _, f := range loops {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	return &wg
}

// stop ends a run: it records when the node last held the cluster's
// state and stops its StatefulSet replicas (a stopped agent cannot fence
// them). No leave: most stops are restarts, back within failure
// detection, when nothing moves (kubelet restarts; Nomad clients'
// leave_on_terminate=false). A dry run, which runs nothing, leaves.
func (a *Agent) stop() {
	if a.mem.members.IsSynced() {
		a.mem.members.markSeen()
	}
	if a.network.dry == nil {
		a.work.replicas.stopStateful()
		return
	}
	if lerr := a.mem.cluster.Leave(5 * time.Second); lerr != nil {
		a.log.Warn("leave cluster", "err", lerr)
	}
}

func (a *Agent) close() {
	a.work.replicas.wg.Wait()
	// After Leave this is a no-op; on an early return it stops memberlist
	// before the store it writes to is closed.
	a.mem.cluster.Shutdown()
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
		a.log.Warn("running with --insecure: gossip is not encrypted or authenticated; anyone on the LAN can read this cluster's state and write to it. Create a secure cluster: start the first agent without --insecure and invite the others with 'starling join-token NODE-NAME'")
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
