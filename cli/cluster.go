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
	"github.com/starling-orchestrator/starling/node/trust"
)

// newInitCmd is `starling init`: a new cluster's secrets, made offline.
func newInitCmd(g *globals) *cobra.Command {
	host, _ := os.Hostname()
	name, dataDir, caDir := host, node.DefaultConfig().DataDir, trust.DefaultCADir()
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create a new cluster: its CA in --ca-dir, this node's key and certificate and the gossip key in --data-dir",
		Long: `Create a new cluster: a certificate authority (Ed25519) written into --ca-dir,
and this node's key and certificate and the gossip key written into
--data-dir (all mode 0600). Then start 'starling agent' with the same --name
and --data-dir; it is the cluster's first node. Invite other nodes with
'starling join-token NODE-NAME' where --ca-dir is: only the CA key can add a
node, so keep --ca-dir off the nodes if you can (on your workstation, or
offline) and no node can add one. An agent started with no --join on an
empty data dir makes a cluster by itself, keeping the CA key in its data
dir (it warns until you move it: 'starling ca move-off').`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pin, err := trust.InitCluster(dataDir, caDir, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "cluster created: CA %s in %s\nstart the agent: starling agent --name %s --data-dir %s ...\nthen invite nodes here: starling join-token NODE-NAME --ca-dir %s\n", pin, caDir, name, dataDir, caDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", name, "this node's name (the agent's --name)")
	cmd.Flags().StringVar(&dataDir, "data-dir", dataDir, "the agent's --data-dir")
	cmd.Flags().StringVar(&caDir, "ca-dir", caDir, "where to keep the cluster's CA certificate and key ($STARLING_CA_DIR, else ~/.starling/ca)")
	return cmd
}

// findCADir is the CA dir join-token uses: --ca-dir when given, else the
// first of DefaultCADir and the agent's default data dir (a first node
// made without 'starling init') that holds a CA key.
func findCADir(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	tried := []string{trust.DefaultCADir(), node.DefaultConfig().DataDir}
	for _, d := range tried {
		if trust.HoldsCAKey(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("no cluster CA key in %s: run 'starling join-token' where the CA key is kept (where 'starling init' ran, or the first node's --data-dir), or pass --ca-dir DIR", strings.Join(tried, " or "))
}

// newJoinTokenCmd is `starling join-token NAME`: an invitation for one
// node, made with the CA key.
func newJoinTokenCmd(g *globals) *cobra.Command {
	ttl, caDir := trust.DefaultJoinTokenTTL, ""
	cmd := &cobra.Command{
		Use:   "join-token NODE-NAME",
		Short: "Print an invitation (join token) for one new node; run it where the CA key is kept",
		Long: `Print an invitation for node NODE-NAME (on stdout, nothing else), made with
the cluster's CA key (--ca-dir; by default ~/.starling/ca, where 'starling
init' keeps it, else the agent's default data dir, where a cluster's first
node keeps it if it made the cluster itself). It holds the new node's key,
its certificate for NODE-NAME and the pin of the CA. Start the node with
  starling agent --name NODE-NAME --join ADDR --join-token-file FILE
before --ttl passes: it checks that ADDR belongs to this cluster, proves it
holds the key, and receives the gossip key. No node holds what it takes to
make one. The invitation is the node's key: keep it like a password, save
it with mode 0600 and delete it once the node joined.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := findCADir(caDir)
			if err != nil {
				return err
			}
			tok, by, err := trust.MakeInvitation(dir, args[0], ttl)
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, tok)
			fmt.Fprintf(cmd.ErrOrStderr(), "invitation for node %s (CA key in %s), to be used by %s; delete it once the node joined\n", args[0], dir, by.Local().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", ttl, "how long the node has to join (1m to 8760h)")
	cmd.Flags().StringVar(&caDir, "ca-dir", "", "the directory holding ca.crt and ca.key (default: ~/.starling/ca, else the agent's default --data-dir)")
	return cmd
}

// newCACmd is `starling ca`: where the cluster's CA key is kept.
func newCACmd(g *globals) *cobra.Command {
	ca := &cobra.Command{Use: "ca", Short: "Keep the cluster's CA key off the nodes"}
	dataDir, caDir := node.DefaultConfig().DataDir, trust.DefaultCADir()
	moveOff := &cobra.Command{
		Use:   "move-off",
		Short: "Move the CA key out of a node's data dir, to where invitations are made",
		Long: `Copy ca.crt and ca.key from the node's --data-dir into --ca-dir (mode 0600),
then remove ca.key from the data dir: from then on the node cannot add nodes,
and 'starling join-token' reads --ca-dir. Take --ca-dir off the machine (a
workstation, a USB key) for the best protection. Restart the agent to drop
the key from its memory too.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := trust.MoveCAKey(dataDir, caDir); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "moved the CA key from %s to %s; restart the agent to drop it from memory; make invitations with 'starling join-token NODE-NAME --ca-dir %s'\n", dataDir, caDir, caDir)
			return nil
		},
	}
	moveOff.Flags().StringVar(&dataDir, "data-dir", dataDir, "the node's data dir that holds ca.key")
	moveOff.Flags().StringVar(&caDir, "ca-dir", caDir, "where to keep the CA ($STARLING_CA_DIR, else ~/.starling/ca)")
	ca.AddCommand(moveOff)
	return ca
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
			c, ctx, cancel, err := g.connect(cmd)
			if err != nil {
				return err
			}
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
