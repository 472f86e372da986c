package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/trust"
)

// The CLI's client config: one cluster's TCP API, the pin of its CA and
// the API token, in a YAML file (mode 0600), like a kubeconfig with one
// context. 'starling config' writes it from a node; --config or
// STARLING_CONFIG select it, else ~/.starling/config when it exists.
// --server and --token (or their environment variables) override its
// server and token.

// defaultConfigPath is ~/.starling/config ("" when there is no home).
func defaultConfigPath() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".starling", "config")
}

var pinRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// loadClientConfig reads the config at path. It refuses a file that group
// or others can read (it holds the token), naming the chmod that fixes it.
func loadClientConfig(path string) (*api.ClientConfig, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("client config: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("client config %s: the file is accessible to group or others (mode %04o) and holds the API token; make it private: chmod 600 %s", path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("client config: %w", err)
	}
	var cc api.ClientConfig
	if err := yaml.UnmarshalStrict(b, &cc); err != nil {
		return nil, fmt.Errorf("client config %s: %w (write it again with 'starling config')", path, err)
	}
	if cc.CAPin != "" && !pinRE.MatchString(cc.CAPin) {
		return nil, fmt.Errorf("client config %s: caPin: want 64 hex digits (the SHA-256 of the cluster CA's public key), got %q", path, cc.CAPin)
	}
	if cc.ServerPin != "" && !pinRE.MatchString(cc.ServerPin) {
		return nil, fmt.Errorf("client config %s: serverPin: want 64 hex digits (the SHA-256 of the server node's public key), got %q", path, cc.ServerPin)
	}
	return &cc, nil
}

// clientConfig returns the client config the globals select: --config,
// else STARLING_CONFIG, else ~/.starling/config if it exists; nil when
// none is selected.
func (g *globals) clientConfig() (*api.ClientConfig, error) {
	path := g.config
	if path == "" {
		path = os.Getenv("STARLING_CONFIG")
	}
	if path == "" {
		path = defaultConfigPath()
		if _, err := os.Stat(path); path == "" || errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
	}
	return loadClientConfig(path)
}

func newConfigCmd(g *globals) *cobra.Command {
	var out, server string
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Write a client config that reaches this cluster over TLS from anywhere",
		Long: `Ask the agent (by default over its unix socket, so run it on a node as
root) for its TCP API address, the pin of the cluster's CA and the API
token, and write them as a client config (YAML, mode 0600) to --output
(default ~/.starling/config; "-" prints it). Copy the file to where you run
the CLI: every command then talks to that agent over TLS, checking its
certificate against the CA pin. --config or STARLING_CONFIG select another
file; --server and --token override its server and token.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cc, err := call(g, cmd, func(ctx context.Context, c *client.Client) (api.ClientConfig, error) { return c.ClientConfig(ctx) })
			if err != nil {
				return err
			}
			if server != "" {
				cc.Server = server
			}
			if cc.Server == "" {
				return errors.New("the agent serves no TCP API: start it with --api-listen ADDR:PORT and --token-file, or pass --api-server https://HOST:PORT")
			}
			b, err := yaml.Marshal(cc)
			if err != nil {
				return err
			}
			b = append([]byte("# Starling client config, written by 'starling config'. It holds the API token: keep it private (mode 0600).\n"), b...)
			if out == "-" {
				_, err := g.stdout.Write(b)
				return err
			}
			if out == "" {
				if out = defaultConfigPath(); out == "" {
					return errors.New("--output: no home directory; name a file")
				}
			}
			if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
				return err
			}
			// A new file, mode 0600 from its creation, renamed into place.
			if err := trust.WritePrivateFile(out, b); err != nil {
				return err
			}
			pin := cc.CAPin
			if len(pin) > 16 {
				pin = pin[:16] + "..."
			}
			fmt.Fprintf(g.stdout, "wrote %s (server %s, CA %s)\n", out, cc.Server, pin)
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", `file to write (default ~/.starling/config; "-" for stdout)`)
	cmd.Flags().StringVar(&server, "api-server", "", "server to write instead of the agent's own API address, e.g. https://192.168.1.11:7443")
	return cmd
}
