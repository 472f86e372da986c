package cli

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// newClusterCmd is `starling cluster`: settings every node shares.
func newClusterCmd(g *globals) *cobra.Command {
	cluster := &cobra.Command{Use: "cluster", Short: "Settings the whole cluster shares"}
	pool := &cobra.Command{
		Use:   "lb-pool [CIDR]",
		Short: "Show or set the pool LoadBalancer Services take their LAN addresses from",
		Long: `Show, or set, the range of LAN addresses LoadBalancer Services take their
address from (e.g. 192.168.1.240/28: a range of the nodes' LAN that its DHCP
server does not give out). Every node allocates the same address to each
Service from it; one live node announces each address on the LAN (ARP).
The pool must be inside the nodes' LAN subnet and hold no node's address:
both are checked here (the subnet when this command runs on a node of the
LAN), and again by each node before it announces an address. It is stored as
the ConfigMap starling-system/lb-pool (key cidr).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, cancel, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			if len(args) == 0 {
				o, err := c.Get(ctx, manifest.KindConfigMap, manifest.LBPoolNamespace, manifest.LBPoolName)
				if apierrors.IsNotFound(err) {
					fmt.Fprintln(g.stdout, "no LoadBalancer pool: set one with 'starling cluster lb-pool CIDR'")
					return nil
				} else if err != nil {
					return err
				}
				var cm corev1.ConfigMap
				if err := json.Unmarshal(o.Object, &cm); err != nil {
					return err
				}
				fmt.Fprintln(g.stdout, cm.Data[manifest.LBPoolKey])
				return nil
			}
			pool, err := manifest.ParseLBPool(args[0])
			if err != nil {
				return fmt.Errorf("lb-pool %q: %w", args[0], err)
			}
			nodes, err := c.Nodes(ctx)
			if err != nil {
				return err
			}
			if err := checkLBPool(pool, nodes, localPrefixes()); err != nil {
				return err
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: manifest.LBPoolName, Namespace: manifest.LBPoolNamespace},
				Data: map[string]string{manifest.LBPoolKey: pool.String()}}
			b, err := manifest.Encode(manifest.Object{Kind: manifest.KindConfigMap, Namespace: cm.Namespace, Name: cm.Name, ConfigMap: cm})
			if err != nil {
				return err
			}
			if _, err := c.Apply(ctx, api.ApplyRequest{Objects: []json.RawMessage{b}}); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "LoadBalancer pool set to %s (ConfigMap %s/%s): LoadBalancer Services take their addresses from it\n", pool, cm.Namespace, cm.Name)
			return nil
		},
	}
	cluster.AddCommand(pool)
	return cluster
}

// checkLBPool refuses a pool that holds a node's address or overlaps a
// node's pod subnet (the cluster CIDR, which every node routes; the
// nodes ignore such a pool, and one overlapping the service CIDR), or,
// when local (this machine's interface prefixes) holds a node's address,
// that lies outside that interface's subnet: the nodes' LAN.
func checkLBPool(pool netip.Prefix, nodes []api.Node, local []netip.Prefix) error {
	for _, n := range nodes {
		if sub, err := netip.ParsePrefix(n.PodSubnet); err == nil && sub.Overlaps(pool) {
			return fmt.Errorf("lb-pool %s overlaps node %s's pod subnet %s (the cluster CIDR): choose a range of the LAN", pool, n.Name, sub)
		}
		a, err := netip.ParseAddr(n.Address)
		if err != nil {
			if ap, err2 := netip.ParseAddrPort(n.Address); err2 == nil {
				a = ap.Addr()
			} else {
				continue
			}
		}
		if pool.Contains(a) {
			return fmt.Errorf("lb-pool %s holds node %s's address %s: choose a range of the LAN that no node (nor the DHCP server) uses", pool, n.Name, a)
		}
		for _, l := range local {
			if l.Addr() == a && !(l.Masked().Contains(pool.Addr()) && l.Bits() <= pool.Bits()) {
				return fmt.Errorf("lb-pool %s is outside the nodes' LAN %s (node %s): choose a range inside it", pool, l.Masked(), n.Name)
			}
		}
	}
	return nil
}

// localPrefixes lists this machine's interface addresses with their
// prefix lengths.
func localPrefixes() []netip.Prefix {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP.To4()); ok {
				ones, _ := ipn.Mask.Size()
				out = append(out, netip.PrefixFrom(ip, ones))
			}
		}
	}
	return out
}
