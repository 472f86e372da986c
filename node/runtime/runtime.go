// Package runtime is the containerd edge of the node agent. It observes
// Starling's containers (everything needed is kept in container labels,
// so a restarted agent rebuilds its view from containerd alone) and
// executes reconcile actions: sandbox set-up through the pod network,
// container create/start/stop/delete, restart bookkeeping, and image
// import and pull.
package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/errdefs"
	containerdlog "github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"

	"github.com/starling-orchestrator/starling/node/dns"
	"github.com/starling-orchestrator/starling/node/logfile"
	"github.com/starling-orchestrator/starling/node/pidns"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// Namespace is the containerd namespace that holds Starling's containers
// and images.
const Namespace = "starling"

// Container labels. Everything the agent needs to rebuild its view after a
// crash is here.
const (
	LabelManaged     = "starling.io/managed"
	LabelName        = "starling.io/replica"
	LabelNamespace   = "starling.io/namespace"
	LabelWorkload    = "starling.io/workload"
	LabelOrdinal     = "starling.io/ordinal"
	LabelSpecHash    = "starling.io/spec-hash"
	LabelPodIP       = "starling.io/pod-ip"
	LabelRestarts    = "starling.io/restarts"
	LabelBackoffStep = "starling.io/backoff-step"
	LabelStartedAt   = "starling.io/started-at"
	LabelGrace       = "starling.io/grace-seconds"
	LabelNode        = "starling.io/node"
	// LabelUID is the UID of the Deployment the replica belongs to
	// (reconcile.Replica.UID); absent for older containers.
	LabelUID = "starling.io/uid"
	// LabelStopReason says why the agent stopped the run that started at
	// LabelStoppedRun (a LabelStartedAt value): a failed liveness or
	// startup probe.
	LabelStopReason = "starling.io/stop-reason"
	LabelStoppedRun = "starling.io/stopped-run"
	// LabelOOMAt is when the kernel's OOM killer last hit the container
	// (containerd's /tasks/oom event); LabelLast is how the run before the
	// current one ended (api.Termination as JSON).
	LabelOOMAt = "starling.io/oom-at"
	LabelLast  = "starling.io/last-termination"
)

// Network is the pod network as the runtime needs it (net/podnet).
type Network interface {
	Attach(ctx context.Context, id string) (net.IP, error)
	Detach(ctx context.Context, id string) error
	NetNSPath(id string) string
	Ready(id string) bool
	Sandboxes() ([]string, error)
}

// Config configures the runtime.
type Config struct {
	// Address is containerd's socket (e.g. /run/containerd/containerd.sock).
	Address string
	// Node is this node's name; it scopes cgroups so nodes sharing one
	// machine never share a cgroup path.
	Node string
	// LogDir receives one "<container id>.log" per replica (stdout+stderr).
	LogDir string
	// PodDir receives one directory per replica, "<container id>", with
	// its hosts, hostname and resolv.conf (podfiles.go).
	PodDir string
	// InsecureRegistries are registry hosts ("host:port") pulled from
	// over plain HTTP (--insecure-registry), as Docker's
	// insecure-registries.
	InsecureRegistries []string
	// ClaimDir holds the volumes of the PersistentVolumeClaims bound to
	// the node (volumes.ClaimDir; "": none mounts).
	ClaimDir string
	// ResolvConf is the node's resolver configuration, which replicas'
	// resolv.conf is made from (default /etc/resolv.conf), and
	// UpstreamResolvConf systemd-resolved's list of real servers, used
	// when the first names only loopback ones (default
	// /run/systemd/resolve/resolv.conf).
	ResolvConf, UpstreamResolvConf string
	// ClusterDomain is the cluster's DNS domain, served by the node's DNS
	// at the gateway of its pod subnet (PodSubnetBits long): the
	// nameserver and search path of ClusterFirst pods; "" gives them the
	// node's resolvers instead.
	ClusterDomain string
	PodSubnetBits int
	// PidsLimit bounds the processes of each container (0: no limit).
	PidsLimit int64
	// AllowHostPath are the directories hostPath volumes may lie under
	// (--allow-host-path; none: hostPath volumes are refused).
	AllowHostPath []string
	// LogDriver is the binary containerd's shim runs to write each
	// container's log (logfile.Main), rotated at LogMaxSize bytes with
	// LogMaxFiles files kept; empty: the shim appends raw output to the
	// log file, unrotated.
	LogDriver   string
	LogMaxSize  int64
	LogMaxFiles int
	// Snapshotter for container root filesystems (default "overlayfs").
	Snapshotter string
	// CgroupParent is the cgroup path under which each container gets
	// "<parent>/<container id>" (default "/starling/<node>").
	CgroupParent string
	// RuncRoot is runc's state directory for this node's containers.
	// containerd's default (/run/containerd/runc/<namespace>) is shared by
	// every containerd on the machine, so two nodes on one machine would
	// take over each other's containers; empty keeps the default.
	RuncRoot string
	// FetchImage, when set, is asked first for an image that is not
	// stored locally (before its registry): it returns the digest the
	// cluster recorded for ref when it was imported ("sha256:...", also
	// with an error when no peer can serve it; "" when none was) and the
	// peers that may have it, best first. The image is pulled from one
	// peer blob by blob, from that digest down, under the name ref alone
	// (see fetchFromPeers); the next source is tried when one fails.
	FetchImage func(ctx context.Context, ref string) (digest string, sources []ImageSource, err error)
}

type Runtime struct {
	cfg    Config
	client *containerd.Client
	net    Network
	log    *slog.Logger
	// execSeq makes exec process IDs unique.
	execSeq atomic.Uint64
	// transfers are the image fetches from peers in flight.
	transfers transfers
	// imageNames orders the creation of image names: pulls from peers
	// (shared) against imports (exclusive), which create names of their
	// own.
	imageNames sync.RWMutex
	// volumes serialises what changes replicas' volumes on the node:
	// their setup at create, their updates (UpdateVolume), their
	// teardown at remove.
	volumes sync.Mutex
	// pods serialises the actions on one replica's containers (pod.go):
	// a container added while its replica is removed or replaced would
	// outlive it, or join its successor.
	pods podLocks
}

// New connects to containerd at cfg.Address and checks that it answers.
// Errors say how to start or install containerd.
func New(ctx context.Context, cfg Config, network Network, log *slog.Logger) (*Runtime, error) {
	if cfg.Snapshotter == "" {
		cfg.Snapshotter = "overlayfs"
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "/starling/" + cfg.Node
	}
	// The containerd client logs through logrus; keep its chatter (e.g.
	// "trying next host" during pulls) out of the agent's slog output.
	containerdlog.L.Logger.SetLevel(logrus.WarnLevel)
	if _, err := os.Stat(cfg.Address); err != nil {
		return nil, fmt.Errorf("containerd socket %s: %w (install the Debian package containerd and start it, or pass --containerd-address)", cfg.Address, err)
	}
	client, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", cfg.Address, err)
	}
	if _, err := client.Version(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("containerd at %s does not answer: %w", cfg.Address, err)
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = "/etc/resolv.conf"
	}
	if cfg.UpstreamResolvConf == "" {
		cfg.UpstreamResolvConf = "/run/systemd/resolve/resolv.conf"
	}
	for _, d := range []string{cfg.LogDir, cfg.PodDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			client.Close()
			return nil, err
		}
	}
	return &Runtime{cfg: cfg, client: client, net: network, log: log}, nil
}

// Close releases the containerd connection. Containers keep running.
func (r *Runtime) Close() error { return r.client.Close() }

func (r *Runtime) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, Namespace)
}

// CgroupPath returns the cgroup path of container id (as in its spec).
func (r *Runtime) CgroupPath(id string) string { return filepath.Join(r.cfg.CgroupParent, id) }

// PreviousLogPath returns the log file of container id's previous run
// (kept when it restarts, for 'logs --previous').
func (r *Runtime) PreviousLogPath(id string) string {
	return filepath.Join(r.cfg.LogDir, id+".previous.log")
}

// LogPath returns the log file of container id.
func (r *Runtime) LogPath(id string) string { return filepath.Join(r.cfg.LogDir, id+".log") }

// Execute carries out one action. Errors name the replica and the step.
func (r *Runtime) Execute(ctx context.Context, a reconcile.Action) error {
	owner := a.Old.ID // the replica whose containers the action touches
	switch {
	case a.Type == reconcile.Create:
		owner = a.Replica.ID
	case !a.Old.Own() && a.Old.ContainerName != "":
		owner = memberOwner(a.Old.ID, a.Old.ContainerName) // a member's
	}
	defer r.pods.lock(owner)()
	if a.Type == reconcile.Replace && a.Replica.ID != a.Old.ID {
		defer r.pods.lock(a.Replica.ID)()
	}
	switch a.Type {
	case reconcile.Create:
		return r.create(ctx, a.Replica)
	case reconcile.Start:
		return r.start(ctx, a.Old.ID, a.Old.Restarts+boolInt(a.Old.State == reconcile.StateExited), a.BackoffStep)
	case reconcile.Remove:
		return r.remove(ctx, a.Old.ID, a.Old.GracePeriod)
	case reconcile.Stop:
		return r.stop(ctx, a.Old, a.Reason)
	case reconcile.AddContainer:
		return r.addContainer(ctx, a.Replica, a.Old, a.Member) // pod.go
	case reconcile.Replace:
		if err := r.remove(ctx, a.Old.ID, a.Old.GracePeriod); err != nil {
			return err
		}
		return r.create(ctx, a.Replica)
	}
	return fmt.Errorf("unknown action %q", a.Type)
}

// processArgs applies Kubernetes' rules: command replaces the image's
// entrypoint (and drops its cmd), args replace the image's cmd.
func processArgs(cfg ocispec.ImageConfig, spec reconcile.Spec) []string {
	entry, cmd := cfg.Entrypoint, cfg.Cmd
	if len(spec.Command) > 0 {
		entry, cmd = spec.Command, nil
	}
	if len(spec.Args) > 0 {
		cmd = spec.Args
	}
	return append(append([]string{}, entry...), cmd...)
}

func (r *Runtime) create(ctx context.Context, rep reconcile.Replica) (err error) {
	ctx = r.ctx(ctx)
	img, ic, err := r.containerImage(ctx, rep, rep.Spec)
	if err != nil {
		return fmt.Errorf("create replica %s: %w", rep.Name, err)
	}
	// A leftover sandbox from an interrupted attempt is torn down first, so
	// the address reservation is not leaked.
	if err := r.net.Detach(ctx, rep.ID); err != nil {
		r.log.Warn("stale sandbox cleanup failed", "replica", rep.Name, "err", err)
	}
	ip, err := r.net.Attach(ctx, rep.ID)
	if err != nil {
		return fmt.Errorf("create replica %s: %w", rep.Name, err)
	}
	defer func() {
		if err != nil {
			if derr := errors.Join(r.net.Detach(context.WithoutCancel(ctx), rep.ID), pidns.Stop(r.podDir(rep.ID))); derr != nil {
				r.log.Warn("sandbox cleanup after failed create", "replica", rep.Name, "err", derr)
			}
		}
	}()
	c, err := r.newContainer(ctx, rep.ID, rep, rep.Spec, img, ic, ip.String(), nil)
	if err != nil {
		return fmt.Errorf("create replica %s: %w", rep.Name, err)
	}
	defer func() {
		if err != nil {
			if derr := c.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup); derr != nil {
				r.log.Warn("container cleanup after failed create", "replica", rep.Name, "err", derr)
			}
		}
	}()
	if len(rep.Spec.Init) > 0 {
		return nil // its init containers run first (reconcile.Plan)
	}
	if err := r.startTask(ctx, c, 0, 0); err != nil {
		return fmt.Errorf("create replica %s: %w", rep.Name, err)
	}
	return nil
}

// containerImage makes image of container spec of rep present (pulled
// with rep's registry credentials) and reads its config; an image with
// no entrypoint, for a container that sets no command, is an error.
func (r *Runtime) containerImage(ctx context.Context, rep reconcile.Replica, spec reconcile.Spec) (containerd.Image, ocispec.ImageConfig, error) {
	img, err := r.EnsureImage(ctx, spec.Image, spec.PullPolicy, rep.PullCreds)
	if err != nil {
		return nil, ocispec.ImageConfig{}, err
	}
	ic, err := imageConfig(ctx, img)
	if err != nil {
		return nil, ocispec.ImageConfig{}, fmt.Errorf("read image config: %w", err)
	}
	if len(processArgs(ic, spec)) == 0 {
		return nil, ocispec.ImageConfig{}, fmt.Errorf("image %s has no entrypoint and the container sets no command", spec.Image)
	}
	return img, ic, nil
}

// newContainer creates container id, which runs container spec of
// replica rep from img (config ic) in rep's sandbox (address podIP):
// the replica's hosts and resolv.conf, its volumes (made when id is
// rep's own, found when it is one of its members), the environment,
// resources and security spec asks for, and labels with everything a
// restarted agent needs, extra among them. Its task is not started.
func (r *Runtime) newContainer(ctx context.Context, id string, rep reconcile.Replica, spec reconcile.Spec, img containerd.Image, ic ocispec.ImageConfig, podIP string, extra map[string]string) (containerd.Container, error) {
	hostname := rep.Spec.Hostname
	if hostname == "" {
		hostname = rep.Name
	}
	resolv, err := dns.HostResolver(r.cfg.ResolvConf, r.cfg.UpstreamResolvConf)
	if err != nil {
		return nil, fmt.Errorf("the node's resolver settings: %w", err)
	}
	mounts, err := podFiles(r.podDir(rep.ID), podIP, hostname, rep, resolv, r.clusterDNS(podIP, rep.Namespace))
	if err != nil {
		return nil, fmt.Errorf("hosts and resolv.conf: %w", err)
	}
	env, vars := containerEnv(spec.Env, rep.ServiceEnv, podFields{Name: rep.Name, Namespace: rep.Namespace, UID: reconcile.PodUID(rep), NodeName: r.cfg.Node, PodIP: podIP, HostIP: rep.HostIP})
	own := id == rep.ID
	var extraNS []specs.LinuxNamespace
	if len(rep.Spec.Volumes) > 0 {
		vmounts, err := r.volumeMounts(rep, spec, r.podDir(rep.ID), vars, own) // volumes.go
		if err != nil {
			if own {
				r.removePodDir(rep.ID) // no tmpfs left mounted
			}
			return nil, err
		}
		mounts = append(mounts, vmounts...)
	}
	spec.Command, spec.Args = expandAll(spec.Command, vars), expandAll(spec.Args, vars)
	args := processArgs(ic, spec)
	grace := int(rep.Spec.GracePeriod / time.Second)
	labels := map[string]string{
		LabelManaged: "true", LabelName: rep.Name, LabelNamespace: rep.Namespace, LabelWorkload: rep.Workload,
		LabelOrdinal: strconv.Itoa(rep.Ordinal), LabelSpecHash: rep.SpecHash, LabelPodIP: podIP,
		LabelRestarts: "0", LabelBackoffStep: "0", LabelGrace: strconv.Itoa(grace), LabelNode: r.cfg.Node,
	}
	if spec.Name != "" {
		labels[LabelContainer] = spec.Name
	}
	maps.Copy(labels, extra)
	if l := lifecycleLabel(spec); l != "" {
		labels[LabelLifecycle] = l
	}
	if rep.UID != "" {
		labels[LabelUID] = rep.UID
	}
	if keys := reconcile.ClaimKeys(rep); own && len(keys) > 0 {
		labels[LabelClaims] = strings.Join(keys, ",")
	}
	if rep.Spec.SharePIDs {
		labels[LabelSharePIDs] = "true"
		pid, ok := pidns.Find(r.podDir(rep.ID))
		if !ok && !own {
			return nil, errors.New("the replica's shared PID namespace is gone")
		}
		if !ok {
			if pid, err = pidns.Start(r.podDir(rep.ID)); err != nil {
				return nil, err
			}
		}
		extraNS = append(extraNS, specs.LinuxNamespace{Type: specs.PIDNamespace, Path: pidns.Path(pid)})
	}
	specOpts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithProcessArgs(args...),
		oci.WithEnv(env),
		oci.WithHostname(hostname),
		oci.WithMounts(mounts),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: r.net.NetNSPath(rep.ID)}),
		oci.WithCgroup(r.CgroupPath(id)),
	}
	for _, ns := range extraNS {
		specOpts = append(specOpts, oci.WithLinuxNamespace(ns))
	}
	if spec.WorkingDir != "" {
		specOpts = append(specOpts, oci.WithProcessCwd(spec.WorkingDir))
	}
	if spec.MemoryBytes > 0 {
		specOpts = append(specOpts, oci.WithMemoryLimit(uint64(spec.MemoryBytes)))
	}
	if spec.CPUMillis > 0 {
		// CFS quota over a 100 ms period, as kubelet maps limits.cpu.
		specOpts = append(specOpts, oci.WithCPUCFS(spec.CPUMillis*100, 100000))
	}
	if spec.CPURequestMillis > 0 {
		// cgroup v1 shares: 1024 per core, as kubelet maps requests.cpu.
		shares := uint64(spec.CPURequestMillis * 1024 / 1000)
		if shares < 2 {
			shares = 2
		}
		specOpts = append(specOpts, oci.WithCPUShares(shares))
	}
	specOpts = append(specOpts, sandboxOpts(spec.Security, r.cfg.PidsLimit)...)
	// A container left over from an interrupted create of the same ID.
	if old, lerr := r.client.LoadContainer(ctx, id); lerr == nil {
		if derr := r.deleteContainer(ctx, old, 0); derr != nil {
			return nil, fmt.Errorf("remove leftover container: %w", derr)
		}
	}
	var runtimeOpts any
	if r.cfg.RuncRoot != "" {
		runtimeOpts = &runcoptions.Options{Root: r.cfg.RuncRoot}
	}
	// A create runs only for a container that does not exist, so a
	// snapshot under its ID is left from a create that was cut short (an
	// agent killed between the snapshot and the container): without this,
	// every retry failed with "already exists", for good.
	if err := r.client.SnapshotService(r.cfg.Snapshotter).Remove(ctx, id); err == nil {
		r.log.Info("removed the snapshot an interrupted create left", "container", id)
	} else if !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("remove a leftover snapshot: %w", err)
	}
	c, err := r.client.NewContainer(ctx, id,
		containerd.WithRuntime(plugins.RuntimeRuncV2, runtimeOpts),
		containerd.WithImage(img),
		containerd.WithSnapshotter(r.cfg.Snapshotter),
		containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(specOpts...),
		containerd.WithContainerLabels(labels),
		// After the labels (which it adds to): the image's StopSignal
		// (nginx SIGQUIT, PostgreSQL SIGINT), SIGTERM when it has none,
		// as CRI stops containers.
		containerd.WithImageStopSignal(img, "SIGTERM"),
	)
	if err != nil {
		return nil, userTerms(err, ic.User, spec.Security.RunAsUser)
	}
	return c, nil
}

// startTask (re)starts container c's task with stdout and stderr appended
// to its log file, and records restarts, backoff step and start time.
func (r *Runtime) startTask(ctx context.Context, c containerd.Container, restarts, backoffStep int) error {
	if t, err := c.Task(ctx, nil); err == nil {
		// A start never kills a running task: one that runs was started
		// by an action this one did not know of; the next observation
		// shows it. An exited task, or one created but never started
		// (an interrupted start), is deleted first.
		st, err := t.Status(ctx)
		if err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("old task: %w", err)
		}
		switch st.Status {
		case containerd.Running, containerd.Paused, containerd.Pausing:
			return ErrTaskRunning
		case containerd.Stopped:
			// Kept for kubectl's Last State: the task's exit goes with it.
			if err := r.recordLast(ctx, c, st); err != nil {
				r.log.Warn("record the last run's exit in labels", "container", c.ID(), "err", err)
			}
			// The run's log stays readable ('logs --previous').
			if err := logfile.Rename(r.LogPath(c.ID()), r.PreviousLogPath(c.ID())); err != nil {
				r.log.Warn("keep the last run's log", "container", c.ID(), "err", err)
			}
		}
		if _, err := t.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete old task: %w", err)
		}
	}
	logs := cio.LogFile(r.LogPath(c.ID()))
	if r.cfg.LogDriver != "" {
		logs = cio.BinaryIO(r.cfg.LogDriver, logfile.Args(r.LogPath(c.ID()), r.cfg.LogMaxSize, r.cfg.LogMaxFiles))
	}
	task, err := c.NewTask(ctx, logs)
	if err != nil {
		return fmt.Errorf("new task: %w", err)
	}
	if err := task.Start(ctx); err != nil {
		task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
		return fmt.Errorf("start task: %w", err)
	}
	// The task runs: failing to record the start only skews the restart
	// count and backoff, so it must not undo the start (and the sandbox).
	run := time.Now().UTC().Format(time.RFC3339Nano)
	labels, err := c.SetLabels(ctx, map[string]string{
		LabelRestarts:    strconv.Itoa(restarts),
		LabelBackoffStep: strconv.Itoa(backoffStep),
		LabelStartedAt:   run,
	})
	if err != nil {
		r.log.Warn("record container start in labels", "container", c.ID(), "err", err)
	}
	if h := hooksOf(labels).PostStart; h != nil {
		r.postStart(ctx, c, task, labels, run, h)
	}
	return nil
}

// postStart runs hook h of the run of c that started at run; when it
// fails the run is stopped (preStop, stop signal, grace period), with
// FailedPostStartHook and the hook's error as its reason, and restarts
// under the usual backoff, as the kubelet does.
func (r *Runtime) postStart(ctx context.Context, c containerd.Container, task containerd.Task, labels map[string]string, run string, h *reconcile.Hook) {
	err := r.runHook(ctx, c.ID(), labels[LabelPodIP], h, PostStartTimeout)
	if err == nil {
		return
	}
	reason := "FailedPostStartHook: " + err.Error()
	r.log.Warn("postStart hook failed; stopping the container", "container", c.ID(), "replica", labels[LabelName], "err", err)
	if _, err := c.SetLabels(ctx, map[string]string{LabelStopReason: reason, LabelStoppedRun: run}); err != nil {
		r.log.Warn("record stop reason in labels", "container", c.ID(), "err", err)
	}
	grace, _ := strconv.Atoi(labels[LabelGrace])
	if err := stopTask(ctx, c, task, r.preStop(ctx, c, task, time.Duration(grace)*time.Second)); err != nil {
		r.log.Warn("stop after a failed postStart hook", "container", c.ID(), "err", err)
	}
}

// recordLast stores how the run that ended with st ended (LabelLast).
func (r *Runtime) recordLast(ctx context.Context, c containerd.Container, st containerd.Status) error {
	labels, err := c.Labels(ctx)
	if err != nil {
		return err
	}
	started, _ := time.Parse(time.RFC3339Nano, labels[LabelStartedAt])
	t := reconcile.Terminated(st.ExitStatus, r.oomKilled(c.ID(), labels, started), started, st.ExitTime)
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	_, err = c.SetLabels(ctx, map[string]string{LabelLast: string(b)})
	return err
}

// ErrTaskRunning: a start found the container's task running; nothing
// was changed.
var ErrTaskRunning = errors.New("the container's task is already running")

func (r *Runtime) start(ctx context.Context, id string, restarts, backoffStep int) error {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	if err := r.startTask(ctx, c, restarts, backoffStep); err != nil {
		return fmt.Errorf("start %s: %w", id, err)
	}
	return nil
}

// remove stops and deletes container id and, for a replica's own
// container, its members (removePod), its sandbox, logs and pod
// directory.
func (r *Runtime) remove(ctx context.Context, id string, grace time.Duration) error {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	var labels map[string]string
	if err == nil {
		labels, err = c.Labels(ctx)
	}
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	if owner := labels[LabelMemberOf]; owner != "" { // a member alone
		if err := r.deleteContainer(ctx, c, grace); err != nil {
			return fmt.Errorf("remove %s: %w", id, err)
		}
		r.removeLogs(id)
		if _, err := r.client.LoadContainer(ctx, owner); !errdefs.IsNotFound(err) {
			return nil // its replica is there: only this member went
		}
		id = owner // its replica went before it: its sandbox goes now
	} else if err := r.removePod(ctx, id, grace); err != nil { // pod.go
		return fmt.Errorf("remove %s: %w", id, err)
	}
	if err := pidns.Stop(r.podDir(id)); err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	if err := r.net.Detach(ctx, id); err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	r.removeLogs(id)
	r.removePodDir(id)
	return nil
}

// removeLogs removes container id's log files (a failure is only
// logged: it returns nil).
func (r *Runtime) removeLogs(id string) error {
	for _, p := range []string{r.LogPath(id), r.PreviousLogPath(id)} {
		if err := logfile.Remove(p); err != nil {
			r.log.Warn("remove log file", "container", id, "err", err)
		}
	}
	return nil
}

// podDir is the directory of container id's hosts, hostname and
// resolv.conf.
func (r *Runtime) podDir(id string) string { return filepath.Join(r.cfg.PodDir, id) }

// stop ends the run of old that was observed (same start time): it
// records reason in the container's labels, then stops the task (SIGTERM,
// SIGKILL after the grace period) and leaves the container, its stopped
// task and its sandbox for a restart. A container that restarted since
// (or has no task) is left alone.
func (r *Runtime) stop(ctx context.Context, old reconcile.Container, reason string) error {
	ctx = r.ctx(ctx)
	c, err := r.client.LoadContainer(ctx, old.ID)
	if err != nil {
		return fmt.Errorf("stop %s: %w", old.ID, err)
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		return fmt.Errorf("stop %s: %w", old.ID, err)
	}
	run := labels[LabelStartedAt]
	if started, _ := time.Parse(time.RFC3339Nano, run); !started.Equal(old.StartedAt) {
		r.log.Info("not stopping a container that restarted since it was observed", "container", old.ID, "reason", reason)
		return nil
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("stop %s: load task: %w", old.ID, err)
	}
	if _, err := c.SetLabels(ctx, map[string]string{LabelStopReason: reason, LabelStoppedRun: run}); err != nil {
		// Only the reason shown to users is lost.
		r.log.Warn("record stop reason in labels", "container", old.ID, "err", err)
	}
	if err := stopTask(ctx, c, task, r.preStop(ctx, c, task, old.GracePeriod)); err != nil {
		return fmt.Errorf("stop %s: %w", old.ID, err)
	}
	return nil
}

// deleteContainer stops c's task (SIGTERM, then SIGKILL after grace) and
// deletes the container with its snapshot.
func (r *Runtime) deleteContainer(ctx context.Context, c containerd.Container, grace time.Duration) error {
	task, err := c.Task(ctx, nil)
	if err == nil {
		if err := stopTask(ctx, c, task, r.preStop(ctx, c, task, grace)); err != nil {
			return err
		}
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task: %w", err)
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("load task: %w", err)
	}
	if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete container: %w", err)
	}
	return nil
}

// stopTask sends c's stop signal (the image's StopSignal, recorded at
// create; SIGTERM without one), waits up to grace, then SIGKILL. A grace
// of 0 (a fenced StatefulSet replica) is SIGKILL at once.
func stopTask(ctx context.Context, c containerd.Container, task containerd.Task, grace time.Duration) error {
	st, err := task.Status(ctx)
	if err != nil || st.Status != containerd.Running && st.Status != containerd.Paused {
		return nil
	}
	exited, err := task.Wait(ctx)
	if err != nil {
		return fmt.Errorf("wait task: %w", err)
	}
	if grace > 0 {
		sig, err := containerd.GetStopSignal(ctx, c, syscall.SIGTERM)
		if err != nil {
			sig = syscall.SIGTERM
		}
		if err := task.Kill(ctx, sig); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("%s: %w", unix.SignalName(sig), err)
		}
		select {
		case <-exited:
			return nil
		case <-time.After(grace):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := task.Kill(ctx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("SIGKILL: %w", err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		return errors.New("task did not exit 10s after SIGKILL")
	}
	return nil
}

// CleanupSandboxes tears down pinned sandboxes that have no container:
// left behind when the agent died between network set-up and container
// creation. claim reserves an ID against concurrent actions (false: an
// action is working on it); with the claim held, the container's absence
// is checked again before the sandbox goes, so a create that finished
// after containers was listed keeps its network.
func (r *Runtime) CleanupSandboxes(ctx context.Context, containers []reconcile.Container, claim func(id string) (release func(), ok bool)) error {
	ids, err := r.net.Sandboxes()
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, c := range containers {
		have[c.ID] = true
	}
	var errs []error
	for _, id := range ids {
		if have[id] {
			continue
		}
		release, ok := claim(id)
		if !ok {
			continue
		}
		if _, err := r.client.LoadContainer(r.ctx(ctx), id); err == nil || !errdefs.IsNotFound(err) {
			release()
			continue
		}
		r.log.Info("removing orphaned sandbox", "container", id)
		errs = append(errs, r.net.Detach(ctx, id))
		release()
	}
	return errors.Join(errs...)
}
