package cli

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/starling-orchestrator/starling/node"
)

func newAgentCmd() *cobra.Command {
	cfg := node.DefaultConfig()
	var logLevel string
	var logJSON bool
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the Starling agent on this node",
		Long: `Run the node agent: it stores desired state, runs this node's replicas in
containerd and serves the API on <data-dir>/starling.sock (and on TCP with
--api-listen and --token-file). SIGTERM or SIGINT stops the agent; the
containers keep running and a restarted agent adopts them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return err
			}
			opts := &slog.HandlerOptions{Level: level}
			var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
			if logJSON {
				h = slog.NewJSONHandler(os.Stderr, opts)
			}
			log := slog.New(h).With("node", cfg.Name)
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
	f.StringVar(&cfg.PodSubnet, "pod-subnet", cfg.PodSubnet, "this node's pod address range, a /24 inside --cluster-cidr")
	f.StringVar(&cfg.ClusterCIDR, "cluster-cidr", cfg.ClusterCIDR, "address range of all pods in the cluster; traffic leaving it is masqueraded")
	f.StringSliceVar(&cfg.CNIPluginDirs, "cni-bin-dir", cfg.CNIPluginDirs, "directories searched for CNI plugins")
	f.StringVar(&cfg.APIListen, "api-listen", "", "also serve the API on TCP ADDR:PORT (requires --token-file)")
	f.StringVar(&cfg.TokenFile, "token-file", "", "file holding the bearer token TCP clients must send")
	f.DurationVar(&cfg.ResyncInterval, "resync-interval", cfg.ResyncInterval, "reconcile at least this often")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.BoolVar(&logJSON, "log-json", false, "log JSON lines instead of text")
	return cmd
}
