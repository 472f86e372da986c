package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/starling-orchestrator/starling/node"
	"github.com/starling-orchestrator/starling/node/api"
)

// dnsFlags are the agent's flags of the node's DNS (node/names).
func dnsFlags(f *pflag.FlagSet, cfg *node.Config) {
	f.StringVar(&cfg.ClusterDomain, "cluster-domain", cfg.ClusterDomain, "the cluster's DNS domain: Services are SVC.NAMESPACE.svc.DOMAIN")
	f.BoolVar(&cfg.ClusterDNS, "cluster-dns", cfg.ClusterDNS, "serve the cluster's names on the node (UDP and TCP 53 at its pod subnet's gateway) and point ClusterFirst pods at it")
	f.StringVar(&cfg.ResolvConf, "resolv-conf", cfg.ResolvConf, "the node's resolvers: names outside the cluster domain are forwarded to them, pods with dnsPolicy Default get them (systemd-resolved's stub is looked through)")
}

// newDNSCmd is 'starling dns lookup'.
func newDNSCmd(g *globals) *cobra.Command {
	d := &cobra.Command{Use: "dns", Short: "The cluster's names as pods resolve them"}
	var qtype, from string
	lookup := &cobra.Command{
		Use:   "lookup NAME [--type A|AAAA|SRV|CNAME|PTR|TXT|MX] [--from REPLICA] [-n NAMESPACE]",
		Short: "Resolve a name as a pod of the namespace (or REPLICA) resolves it, through its node's DNS",
		Long: "Resolve NAME as a ClusterFirst pod does: through the DNS of the node the CLI talks to, trying\n" +
			"the search path NS.svc.DOMAIN svc.DOMAIN DOMAIN as ndots:5 says, and print every name tried and\n" +
			"the answer. --from REPLICA resolves it as that replica of the namespace (-n) does: the node the CLI\n" +
			"talks to asks the replica's node, which answers from its own view and DNS.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, cancel, err := g.connect(cmd) // a lookup is bounded as any request
			if err != nil {
				return err
			}
			defer cancel()
			q := api.DNSQuery{Name: args[0], Type: strings.ToUpper(qtype), Namespace: g.namespace, From: strings.TrimPrefix(from, "replica/")}
			a, err := c.DNSLookup(ctx, q)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "server %s (node %s), as a pod of namespace %s", a.Server, a.Node, a.Namespace)
			if q.From != "" {
				fmt.Fprintf(g.stdout, "; as replica %s, which runs on node %s", q.From, a.Node)
			}
			fmt.Fprintf(g.stdout, "\ntried %s\n%s %s\n", strings.Join(a.Tried, " "), a.Name, a.Rcode)
			for _, rr := range a.Answers {
				fmt.Fprintln(g.stdout, rr)
			}
			if len(a.Answers) == 0 {
				if a.Rcode == "SERVFAIL" {
					return fmt.Errorf("%s: the node's DNS could not get an answer (SERVFAIL): for a name outside the cluster, check that the node reaches its upstream resolvers (--resolv-conf)", args[0])
				}
				return fmt.Errorf("%s: no %s record (%s)", args[0], q.Type, a.Rcode)
			}
			return nil
		},
	}
	lookup.Flags().StringVar(&qtype, "type", "A", "the record type")
	lookup.Flags().StringVar(&from, "from", "", "resolve as this replica of the namespace (-n) would, on its node")
	lookup.Flags().StringVarP(&g.namespace, "namespace", "n", "default", "namespace")
	d.AddCommand(lookup)
	return d
}
