package cli

import (
	"errors"
	"math"

	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/dustin/go-humanize"

	"github.com/spf13/cobra"

	"github.com/starling-orchestrator/starling/node"
	"github.com/starling-orchestrator/starling/node/dns"
	"github.com/starling-orchestrator/starling/node/fencewatch"
)

func newAgentCmd() *cobra.Command {
	cfg := node.DefaultConfig()
	var logLevel, oldKeyFile string
	var logJSON bool
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the Starling agent on this node",
		Long: `Run the node agent: it stores desired state, runs this node's replicas in
containerd and serves the API on <data-dir>/starling.sock (and on TCP with
--api-listen and --token-file). SIGTERM or SIGINT stops the agent; the
containers keep running and a restarted agent adopts them.

Before it changes anything the agent checks the host (root, containerd,
runc, the CNI plugins, iptables, kernel modules bridge, veth,
br_netfilter, nf_conntrack, nf_nat, writable sysctls) and, if anything is
missing, refuses to start with one line per problem naming the Debian
package to install, the module to load or the flag to change.

Security: with no --join the agent creates a new cluster: a CA, the
gossip key and its node certificate, kept in --data-dir (or run 'starling
init --ca-dir DIR' first to keep the CA key off the node). Each other node
is invited where the CA key is kept, 'starling join-token NODE-NAME', and
joins with that invitation:
  starling agent --name node2 --join 192.168.1.11 --join-token-file /etc/starling/join.token
The invitation holds the node's key and its certificate; the node it joins
through checks them and gives it the gossip key. No node receives the CA
key, so no node can add another. Peers talk TLS on the gossip port + 1
(7947). --insecure runs without any of this (test clusters only).

With --dry-run the agent joins the cluster (gossip, desired state, the API
socket) but claims no pod subnet, starts no container and touches no
bridge, route, iptables rule or sysctl; peers place no replicas on it. It
prints to stdout, each time one of them changes: the pod subnet it would
claim, the routes to peers' pod subnets it would install ("ip route
replace ... proto 87" lines) and the iptables-restore text of the Service
rules it would apply, from its live view of the cluster; and what a real
start would find missing on this host. Use it to check a new host before
its first real start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if oldKeyFile != "" {
				return fmt.Errorf("--encrypt-key-file was replaced by invitations: the first node makes the cluster's keys (or 'starling init'); run 'starling join-token NODE-NAME' where the CA key is kept and start each node with --join ADDR --join-token-file FILE")
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: use debug, info, warn or error", logLevel)
			}
			opts := &slog.HandlerOptions{Level: level}
			var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
			if logJSON {
				h = slog.NewJSONHandler(os.Stderr, opts)
			}
			log := slog.New(h)
			// containerd's shim runs this binary as each container's
			// log writer (node/logfile).
			if self, err := os.Executable(); err == nil {
				cfg.LogDriver = self
			} else {
				log.Warn("container logs are written unrotated: this binary's path is unknown", "err", err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			a, err := node.New(ctx, cfg, log)
			if err != nil {
				return err
			}
			return a.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Name, "name", cfg.Name, "node name, unique in the cluster")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the store, logs, sandboxes and the API socket")
	f.StringVar(&cfg.ContainerdAddress, "containerd-address", cfg.ContainerdAddress, "containerd's gRPC socket")
	f.StringVar(&cfg.Snapshotter, "snapshotter", cfg.Snapshotter, "containerd snapshotter for container root filesystems")
	f.StringVar(&cfg.ProxyMode, "proxy-mode", cfg.ProxyMode, `how Service rules are written: "nftables" (the ip starling table), "iptables", or "" to choose by the host (nftables, unless the kernel lacks it or is older than 5.13, or the host's firewall is on iptables-legacy)`)
	f.StringVar(&cfg.CgroupParent, "cgroup-parent", "", "cgroup under which each replica gets its own (default /starling/<name>)")
	f.StringVar(&cfg.RuncRoot, "runc-root", "", "runc state directory for this node's containers (default /run/starling/<name>/runc)")
	f.StringVar(&cfg.PodSubnet, "pod-subnet", "", "this node's pod address range, a /24 inside --cluster-cidr (default: claim a free /24 and keep it)")
	f.DurationVar(&cfg.SubnetSettle, "subnet-settle", cfg.SubnetSettle, "a new subnet claim must stand this long without conflict before pods run on it")
	f.DurationVar(&cfg.SubnetReclaimAfter, "subnet-reclaim-after", cfg.SubnetReclaimAfter, "the subnet of a dead node is reused only after this long (or 'starling node forget')")
	f.StringVar(&cfg.ClusterCIDR, "cluster-cidr", cfg.ClusterCIDR, "address range of all pods in the cluster; traffic leaving it is masqueraded")
	f.StringVar(&cfg.ServiceCIDR, "service-cidr", cfg.ServiceCIDR, "range ClusterIPs are allocated from")
	f.StringSliceVar(&cfg.CNIPluginDirs, "cni-bin-dir", cfg.CNIPluginDirs, "directories searched for CNI plugins")
	f.StringVar(&cfg.APIListen, "api-listen", "", "also serve the API on TCP ADDR:PORT (requires --token-file)")
	f.StringVar(&cfg.TokenFile, "token-file", "", "file holding the bearer token TCP clients must send")
	f.DurationVar(&cfg.ResyncInterval, "resync-interval", cfg.ResyncInterval, "reconcile at least this often")
	f.StringVar(&cfg.BindAddr, "bind", cfg.BindAddr, "gossip listen address IP:PORT (TCP and UDP)")
	f.StringVar(&cfg.Advertise, "advertise", "", "address peers reach this node at, IP or IP:PORT (default: the bind address or a private one)")
	f.StringSliceVar(&cfg.Join, "join", nil, "seed nodes to join, HOST[:PORT][,...]; any one is enough")
	f.StringVar(&cfg.JoinTokenFile, "join-token-file", "", "file (mode 0600) holding an invitation from 'starling join-token NODE-NAME'; a new node joins through --join with it (a node that joined before does not need it)")
	f.BoolVar(&cfg.Insecure, "insecure", false, "run with no CA, gossip key or join token: gossip in the clear, open to anyone on the LAN (test clusters only; warned about and shown in 'get nodes')")
	f.StringVar(&oldKeyFile, "encrypt-key-file", "", "replaced by join tokens")
	f.MarkHidden("encrypt-key-file")
	f.Var(byteSize{&cfg.MaxImageBytes}, "max-image-size", "largest image tarball accepted by 'image import' or from a peer, e.g. 512MiB, 4GiB")
	f.DurationVar(&cfg.TombstoneTTL, "tombstone-ttl", cfg.TombstoneTTL, "how long deletes are remembered; a node away longer resyncs from scratch")
	f.DurationVar(&cfg.HandoffTimeout, "handoff-timeout", cfg.HandoffTimeout, "how long an old owner keeps a moved replica while the new owner starts it")
	f.Var(byteSize{&cfg.LogMaxSize}, "container-log-max-size", "a container's log is rotated at this size, e.g. 10MiB")
	f.IntVar(&cfg.LogMaxFiles, "container-log-max-files", cfg.LogMaxFiles, "log files kept per container run, the one being written included")
	f.Int64Var(&cfg.PidsLimit, "pids-limit", cfg.PidsLimit, "most processes (and threads) one container may run: a fork bomb stops there; 0 for no limit")
	dnsFlags(f, &cfg)     // dns.go
	ingressFlags(f, &cfg) // ingress.go
	f.StringSliceVar(&cfg.AllowHostPath, "allow-host-path", nil, "a directory under which pods' hostPath volumes may lie (repeatable); none by default: hostPath volumes are refused")
	f.StringSliceVar(&cfg.InsecureRegistries, "insecure-registry", nil, "a registry (HOST:PORT) pulled from over plain HTTP, as Docker's insecure-registries (repeatable)")
	f.DurationVar(&cfg.AckTimeout, "ack-timeout", cfg.AckTimeout, "a node that lists none of the Deployment replicas placed on it for this long (it says it is ready but runs nothing) is left out of Deployments' placement for a while; below --handoff-timeout; 0 turns the check off")
	f.DurationVar(&cfg.RejoinSettle, "rejoin-settle", cfg.RejoinSettle, "a node back from dead gets replicas again only after this long (flap damping)")
	f.DurationVar(&cfg.FailoverTimeout, "failover-timeout", cfg.FailoverTimeout, "how long a StatefulSet replica of a dead node stays reserved before another node starts it (at least --fence-timeout + 5s)")
	f.DurationVar(&cfg.DrainDelay, "drain-delay", cfg.DrainDelay, "a running replica being stopped is first taken out of every node's Service endpoints and stopped only this much later (0: at once)")
	f.DurationVar(&cfg.FenceTimeout, "fence-timeout", cfg.FenceTimeout, "a node that has not heard from a majority of the cluster for this long kills its StatefulSet replicas")
	f.StringToStringVar(&cfg.Labels, "node-label", nil, "node labels KEY=VALUE[,...] for nodeSelector")
	f.DurationVar(&cfg.ProbeInterval, "probe-interval", 0, "failure detection: time between probes (default 1s, memberlist LAN)")
	f.DurationVar(&cfg.ProbeTimeout, "probe-timeout", 0, "failure detection: wait for a probe ack before indirect probes (default 500ms)")
	f.IntVar(&cfg.SuspicionMult, "suspicion-mult", 0, "failure detection: a node is dead after about this many probe intervals, times log10(N) (default 4)")
	f.BoolVar(&cfg.DryRun, "dry-run", false, "join the cluster but change nothing on this host: print the pod subnet, routes and Service rules it would install, whenever they change")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.BoolVar(&logJSON, "log-json", false, "log JSON lines instead of text")
	return cmd
}

// byteSize is a flag holding a size in bytes, written as 4GiB, 512MiB,
// 100MB or a plain number of bytes (go-humanize's ParseBytes).
type byteSize struct{ v *int64 }

func (b byteSize) String() string {
	if b.v == nil {
		return ""
	}
	return humanize.IBytes(uint64(*b.v))
}

func (b byteSize) Set(s string) error {
	n, err := humanize.ParseBytes(s)
	if err != nil || n == 0 || n > math.MaxInt64 {
		return fmt.Errorf("want a size such as 512MiB or 4GiB")
	}
	*b.v = int64(n)
	return nil
}

func (b byteSize) Type() string { return "size" }

// newDNSServerCmd is 'starling dns-server', the node's DNS, which the
// agent starts (node/names); hidden, as nobody runs it by hand.
func newDNSServerCmd() *cobra.Command {
	var listen, zone string
	var upstreams []string
	cmd := &cobra.Command{
		Use:    "dns-server --listen IP:53 --zone FILE [--upstream IP:53...]",
		Short:  "Answer the cluster's names and forward the others (started by the agent)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if listen == "" || zone == "" {
				return errors.New("--listen and --zone: required (the agent gives them)")
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)).With("component", "dns-server")
			z, err := dns.Load(zone)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				log.Warn("read the zone", "err", err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return dns.NewServer(dns.Config{Addr: listen, ZoneFile: zone, Upstreams: upstreams, Log: log}, z).Run(ctx)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "address to answer on, UDP and TCP (IP:53)")
	cmd.Flags().StringVar(&zone, "zone", "", "the zone file the agent writes")
	cmd.Flags().StringArrayVar(&upstreams, "upstream", nil, "a resolver of the names outside the cluster domain (IP:53); repeat for several")
	return cmd
}

// newFenceWatchdogCmd is 'starling fence-watchdog', which the agent starts
// (node/watchdog.go); hidden, as nobody runs it by hand.
func newFenceWatchdogCmd() *cobra.Command {
	var lease string
	cmd := &cobra.Command{
		Use:    "fence-watchdog --lease FILE",
		Short:  "Kill this node's StatefulSet replicas when the agent stops renewing its lease (started by the agent)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if lease == "" {
				return errors.New("--lease: required (the agent's <data-dir>/fence.lease)")
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)).With("component", "fence-watchdog")
			return fencewatch.Run(cmd.Context(), lease, log)
		},
	}
	cmd.Flags().StringVar(&lease, "lease", "", "the agent's lease file (<data-dir>/fence.lease)")
	return cmd
}
