package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/starling-orchestrator/starling/node"
	"github.com/starling-orchestrator/starling/node/api"
)

// newInitCmd is `starling init`: a new cluster's secrets, made offline.
func newInitCmd(g *globals) *cobra.Command {
	host, _ := os.Hostname()
	name, dataDir := host, node.DefaultConfig().DataDir
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create a new cluster's CA, gossip key and this node's certificate in --data-dir",
		Long: `Create a new cluster: a certificate authority (Ed25519), the gossip key and
this node's key and certificate, written (mode 0600) into --data-dir. Then
start 'starling agent' with the same --name and --data-dir; it is the
cluster's first node. An agent started with no --join on an empty data dir
does the same by itself. Invite other nodes with 'starling join-token'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pin, err := node.InitCluster(dataDir, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "cluster created in %s (CA %s)\nstart the agent: starling agent --name %s --data-dir %s ...\nthen invite nodes: starling join-token\n", dataDir, pin, name, dataDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", name, "this node's name (the agent's --name)")
	cmd.Flags().StringVar(&dataDir, "data-dir", dataDir, "the agent's --data-dir")
	return cmd
}

// newJoinTokenCmd is `starling join-token`: a token that admits nodes.
func newJoinTokenCmd(g *globals) *cobra.Command {
	ttl := node.DefaultJoinTokenTTL
	cmd := &cobra.Command{
		Use:   "join-token",
		Short: "Print a new token that lets nodes join the cluster",
		Long: `Print a new join token (on stdout, nothing else). It holds the pin of the
cluster's CA and a secret; a node started with
  starling agent --join ADDR --join-token-file FILE
checks that ADDR belongs to this cluster, proves it holds the secret and
receives the gossip key and a certificate for its name. The token admits
any number of nodes until --ttl passes or 'starling node forget' deletes
every token. Keep it like a password: save it with mode 0600.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl < time.Minute || ttl > node.MaxJoinTokenTTL {
				return fmt.Errorf("--ttl %s: must be between 1m and %s (units: s, m, h; e.g. 24h)", ttl, node.MaxJoinTokenTTL)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, cancel := timeoutCtx(cmd)
			defer cancel()
			var tok api.JoinToken
			if tok, err = c.JoinToken(ctx, api.JoinTokenRequest{TTLSeconds: int64(ttl / time.Second)}); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, tok.Token)
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", ttl, "how long the token admits nodes (1m to 8760h)")
	return cmd
}

// newKeysCmd is `starling keys`: the cluster's gossip keyring.
func newKeysCmd(g *globals) *cobra.Command {
	keys := &cobra.Command{Use: "keys", Short: "Manage the cluster's gossip key"}
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Move every node to a new gossip key with no downtime",
		Long: `Make a new gossip key and move every live node to it in three steps, as
Consul and serf do: install it everywhere (accepted alongside the old one),
use it everywhere (encrypt with it), remove the old one everywhere. The
cluster keeps working between steps. The key goes to each node over mutual
TLS with node certificates, never over gossip, so a node removed with
'starling node forget' cannot learn it. A node that was down takes the new
key from a peer when it comes back. If a step fails on a node, the
rotation stops there with every node still able to read every other; run
it again once the node is up.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, cancel := timeoutCtx(cmd)
			defer cancel()
			var res api.KeyRotation
			res, err = c.RotateKeys(ctx)
			printRotation(g.stdout, res)
			if err != nil {
				return err
			}
			printRotationDone(g.stdout, res)
			return nil
		},
	}
	keys.AddCommand(rotate)
	return keys
}

// printRotation prints the steps of a gossip key rotation, one line each.
func printRotation(w io.Writer, res api.KeyRotation) {
	for _, s := range res.Steps {
		state := "done"
		if len(s.Failed) > 0 {
			state = fmt.Sprintf("FAILED on %s", strings.Join(s.Failed, "; "))
		}
		fmt.Fprintf(w, "%-8s key %s on %d nodes: %s\n", s.Op, s.Key, len(res.Nodes), state)
	}
}

// printRotationDone prints the outcome of a finished rotation.
func printRotationDone(w io.Writer, res api.KeyRotation) {
	fmt.Fprintf(w, "gossip key rotated to %s on %s\n", res.Key, strings.Join(res.Nodes, ", "))
	if res.Resumed {
		fmt.Fprintln(w, "(a rotation had not finished: it was completed with the key in use instead of a new one; run again for a new key)")
	}
	if len(res.Down) > 0 {
		fmt.Fprintf(w, "down (they take the new key from a peer when they return): %s\n", strings.Join(res.Down, ", "))
	}
	if len(res.Skipped) > 0 {
		fmt.Fprintf(w, "skipped, no certified identity (forgotten, or not a node): %s\n", strings.Join(res.Skipped, ", "))
	}
}
