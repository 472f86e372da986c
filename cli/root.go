// Package cli is Starling's command line: the agent command that runs a
// node, and the client commands (apply, get, describe, delete, scale,
// rollout, logs, image import, version) that talk to any agent's API.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/starling-orchestrator/starling/node"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
)

// globals are the flags every client command shares.
type globals struct {
	server    string
	token     string
	config    string
	namespace string
	stdin     io.Reader
	stdout    io.Writer
}

// client is a client for the selected agent: --server and --token (or
// STARLING_SERVER and STARLING_TOKEN) when given, else the client
// config's (clientConfig), else the local agent's unix socket. A client
// config's CA pin is checked against the server's certificate.
func (g *globals) client() (*client.Client, error) {
	cc, err := g.clientConfig()
	if err != nil {
		return nil, err
	}
	server, token, caPin, serverPin := g.server, g.token, "", ""
	if cc != nil {
		if server == "" {
			server = cc.Server
		}
		if token == "" {
			token = cc.Token
		}
		caPin, serverPin = cc.CAPin, cc.ServerPin
		if caPin != "" && strings.HasPrefix(server, "http://") {
			// The config's token must never go out in the clear.
			return nil, fmt.Errorf("--server %s: the client config is for a cluster that serves TLS; use https://%s", server, strings.TrimPrefix(server, "http://"))
		}
	}
	if server == "" {
		server = node.SocketPath(node.DefaultConfig().DataDir)
	}
	return client.New(server, client.WithToken(token), client.WithPins(caPin, serverPin))
}

// NewRoot builds the starling command tree. stdin and stdout are where
// client commands read manifests ("-f -") and print.
func NewRoot(stdin io.Reader, stdout io.Writer) *cobra.Command {
	g := &globals{stdin: stdin, stdout: stdout}
	root := &cobra.Command{
		Use:   "starling",
		Short: "Starling: a container orchestrator with no master",
		Long: `Starling runs Kubernetes-shaped Deployments, StatefulSets and Services on small clusters
where every node runs the same agent and no control plane can be lost.

Run 'starling agent' on each node; every other command talks to an agent.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	pf := root.PersistentFlags()
	pf.StringVar(&g.server, "server", os.Getenv("STARLING_SERVER"),
		"agent to talk to: a unix socket path or https://host:port (env STARLING_SERVER; default: the client config's, else "+node.SocketPath(node.DefaultConfig().DataDir)+")")
	pf.StringVar(&g.config, "config", "", "client config file written by 'starling config' (env STARLING_CONFIG; default ~/.starling/config if it exists)")
	pf.StringVar(&g.token, "token", os.Getenv("STARLING_TOKEN"), "bearer token for a TCP server (env STARLING_TOKEN)")
	root.AddCommand(
		newAgentCmd(),
		newInitCmd(g),
		newJoinTokenCmd(g),
		newCACmd(g),
		newConfigCmd(g),
		newKeysCmd(g),
		newClusterCmd(g),
		newApplyCmd(g),
		newCreateCmd(g),
		newGetCmd(g),
		newDescribeCmd(g),
		newDeleteCmd(g),
		newScaleCmd(g),
		newRolloutCmd(g),
		newLogsCmd(g),
		newImageCmd(g),
		newNodeCmd(g),
		newVolumeCmd(g),
		newVersionCmd(g),
		newFenceWatchdogCmd(),
		newDNSServerCmd(),
		newDNSCmd(g),
	)
	return root
}

// Execute runs the CLI with os.Args and returns the process exit code:
// 0 on success, 1 with a one-line reason on stderr otherwise.
func Execute() int {
	root := NewRoot(os.Stdin, os.Stdout)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", withHint(err))
		return 1
	}
	return 0
}

// withHint adds to an error from a CLI call that reached no agent what
// the user can check (the client's own error says only what failed).
func withHint(err error) error {
	var te *client.TransportError
	if errors.As(err, &te) && !te.Pin {
		return fmt.Errorf("%w (is 'starling agent' running? set --server or STARLING_SERVER, or use a client config: --config)", err)
	}
	return err
}

// defaultTimeout bounds every CLI call except log streaming and imports.
const defaultTimeout = 60 * time.Second

func timeoutCtx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), defaultTimeout)
}

// connect returns a client of the agent (see client) and a context that
// ends after defaultTimeout (timeoutCtx); the caller calls cancel when
// done. Its errors are client's.
func (g *globals) connect(cmd *cobra.Command) (*client.Client, context.Context, context.CancelFunc, error) {
	c, err := g.client()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := timeoutCtx(cmd)
	return c, ctx, cancel, nil
}

// printResult prints what a write did to one object (resultLine), or
// returns err.
func (g *globals) printResult(res api.ApplyResult, err error) error {
	if err != nil {
		return err
	}
	fmt.Fprintln(g.stdout, resultLine(res))
	return nil
}

// call calls f with a client of the agent and a context that ends after
// defaultTimeout, and returns what f returns: one request's answer.
// Errors are connect's or f's.
func call[T any](g *globals, cmd *cobra.Command, f func(context.Context, *client.Client) (T, error)) (T, error) {
	c, ctx, cancel, err := g.connect(cmd)
	if err != nil {
		var zero T
		return zero, err
	}
	defer cancel()
	return f(ctx, c)
}

// age renders the time since since as kubectl's AGE column does
// (duration.HumanDuration: 45s, 12m, 3h10m, 2d3h, 4y); "<unknown>" for
// the zero time.
func age(since time.Time) string {
	if since.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(time.Since(since))
}
