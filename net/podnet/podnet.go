// Package podnet gives each replica its own network namespace on the node
// bridge, through libcni: the CNI bridge plugin (gateway on the bridge,
// hairpin mode on, no masquerade of its own) with host-local IPAM on the
// node's pod subnet, plus the loopback plugin. It also prepares the node's
// own network namespace: IP forwarding, bridge netfilter, and one
// masquerade rule for traffic that leaves the cluster CIDR.
//
// All state (pinned namespaces, CNI result cache, IPAM reservations) lives
// under the node's data directory, so several nodes can share one machine.
package podnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// Config configures the pod network of one node.
type Config struct {
	// DataDir holds netns/ (pinned namespaces), cni-cache/ and ipam/.
	DataDir string
	// Bridge is the node bridge's name (default "starling0").
	Bridge string
	// PodSubnet is the node's /24 (e.g. 10.22.1.0/24).
	PodSubnet *net.IPNet
	// ClusterCIDR is the whole pod address space (e.g. 10.22.0.0/16);
	// traffic to it keeps its source address.
	ClusterCIDR *net.IPNet
	// PluginDirs are searched for CNI plugin binaries.
	PluginDirs []string
	// MTU of the bridge and pod interfaces (0: plugin default).
	MTU int
	// Iptables is the iptables command of the backend the host uses
	// (net/xtables); "" for the plain "iptables".
	Iptables string
}

// DefaultPluginDirs are where Debian (containernetworking-plugins) and the
// upstream release tarballs put the CNI plugins.
var DefaultPluginDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// Network attaches and detaches replica sandboxes.
type Network struct {
	cfg      Config
	cni      *libcni.CNIConfig
	loopback *libcni.NetworkConfigList

	mu     sync.Mutex
	bridge *libcni.NetworkConfigList // nil until the pod subnet is known
	// attaching is held (read) by each Attach from reading the bridge
	// configuration to the end of its CNI ADD, and (write) by SetSubnet:
	// an ADD in flight with the old configuration would put the old
	// gateway back on the bridge (the plugin's "forceAddress") after SetSubnet moved it.
	attaching sync.RWMutex

	// hostMu serializes PrepareHost and KeepHost (they create and
	// rewrite the same chain); prepared: PrepareHost succeeded once.
	hostMu   sync.Mutex
	prepared bool
}

const networkName = "starling"

// New checks that the CNI plugins exist and builds the network
// configuration. cfg.PodSubnet may be nil when the node has yet to claim
// one: call SetSubnet before Attach. Errors name the missing plugin and
// the package to install.
func New(cfg Config) (*Network, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = "starling0"
	}
	if len(cfg.PluginDirs) == 0 {
		cfg.PluginDirs = DefaultPluginDirs
	}
	if cfg.ClusterCIDR == nil {
		return nil, errors.New("podnet: cluster CIDR is required")
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback"} {
		if _, err := findPlugin(cfg.PluginDirs, plugin); err != nil {
			return nil, err
		}
	}
	loopback, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.0.0","name":"starling-lo","plugins":[{"type":"loopback"}]}`))
	if err != nil {
		return nil, fmt.Errorf("podnet: loopback network config: %w", err)
	}
	n := &Network{
		cfg:      cfg,
		cni:      libcni.NewCNIConfigWithCacheDir(cfg.PluginDirs, filepath.Join(cfg.DataDir, "cni-cache"), nil),
		loopback: loopback,
	}
	if cfg.PodSubnet != nil {
		if _, err := n.setSubnet(cfg.PodSubnet); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// SetSubnet sets the node's pod subnet (its /24) and builds the bridge
// network configuration for it. When the node bridge exists with another
// address (the node's claim was displaced, net/ipam.Displaced, or lost
// while it was down), it moves the bridge to the new subnet's gateway;
// sandboxes attached before keep their old addresses until they are
// rebuilt. It waits for the attaches in flight (their CNI ADD) to end.
func (n *Network) SetSubnet(subnet *net.IPNet) error {
	n.attaching.Lock()
	defer n.attaching.Unlock()
	gw, err := n.setSubnet(subnet)
	if err != nil {
		return err
	}
	// A restarted node whose kept claim lost finds its bridge on the old
	// subnet too.
	ones, _ := subnet.Mask.Size()
	return readdressBridge(n.cfg.Bridge, &net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(ones, 32)})
}

// setSubnet builds the bridge configuration for subnet and returns its
// gateway address, touching nothing on the host.
func (n *Network) setSubnet(subnet *net.IPNet) (netip.Addr, error) {
	network, ok := netip.AddrFromSlice(subnet.IP.Mask(subnet.Mask).To4())
	if !ok {
		return netip.Addr{}, fmt.Errorf("pod subnet %s: not IPv4", subnet)
	}
	gw := network.Next() // the bridge's address: the subnet's first
	bridgeConf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       networkName,
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      n.cfg.Bridge,
			"isGateway":   true,
			"hairpinMode": true,
			// The bridge may still hold the gateway of a subnet the
			// node moved from: the plugin replaces it.
			"forceAddress": true,
			"ipMasq":       false,
			"mtu":          n.cfg.MTU,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": subnet.String(), "gateway": gw.String()}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": filepath.Join(n.cfg.DataDir, "ipam"),
			},
		}},
	}
	raw, _ := json.Marshal(bridgeConf)
	bridge, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("podnet: bridge network config: %w", err)
	}
	n.mu.Lock()
	n.cfg.PodSubnet, n.bridge = subnet, bridge
	n.mu.Unlock()
	return gw, nil
}

func (n *Network) bridgeConf() (*libcni.NetworkConfigList, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.bridge == nil {
		return nil, errors.New("podnet: the node has no pod subnet yet")
	}
	return n.bridge, nil
}

func findPlugin(dirs []string, name string) (string, error) {
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("CNI plugin %q not found in %s: install the Debian package containernetworking-plugins", name, strings.Join(dirs, ", "))
}

// NetNSPath returns where the namespace of sandbox id is pinned.
func (n *Network) NetNSPath(id string) string { return filepath.Join(n.cfg.DataDir, "netns", id) }

func (n *Network) runtimeConf(id string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: n.NetNSPath(id), IfName: "eth0"}
}

// attachTimeout bounds the CNI ADD calls of one Attach, as the kubelet's
// --runtime-request-timeout (2 minutes) bounds a sandbox's: a plugin that
// hangs would hold the attach lock, and a subnet move (SetSubnet) with
// it, for as long as it hangs. libcni kills the plugin when it passes.
var attachTimeout = 2 * time.Minute

// Attach creates the sandbox of replica id: a pinned network namespace
// with eth0 on the bridge and an address from the pod subnet. It returns
// the pod IP. On error nothing is left behind (no namespace, veth or
// address reservation). The CNI calls end after attachTimeout.
func (n *Network) Attach(ctx context.Context, id string) (net.IP, error) {
	n.attaching.RLock()
	defer n.attaching.RUnlock()
	ctx, cancel := context.WithTimeout(ctx, attachTimeout)
	defer cancel()
	bridge, err := n.bridgeConf()
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	path := n.NetNSPath(id)
	if err := newNetNS(path); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	rt := n.runtimeConf(id)
	if _, err := n.cni.AddNetworkList(ctx, n.loopback, rt); err != nil {
		n.detachAfterFailure(ctx, id)
		return nil, fmt.Errorf("sandbox %s: CNI loopback: %w", id, err)
	}
	res, err := n.cni.AddNetworkList(ctx, bridge, rt)
	if err != nil {
		n.detachAfterFailure(ctx, id)
		return nil, fmt.Errorf("sandbox %s: CNI bridge: %w", id, err)
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil || len(cur.IPs) == 0 {
		n.detachAfterFailure(ctx, id)
		return nil, fmt.Errorf("sandbox %s: CNI returned no address (%v)", id, err)
	}
	return cur.IPs[0].Address.IP, nil
}

// detachAfterFailure is Detach after an Attach failed, ctx's or not
// (a timeout), bounded like the attach: a plugin that hung on ADD may
// hang on DEL too, and the attach lock is held meanwhile.
func (n *Network) detachAfterFailure(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), attachTimeout)
	defer cancel()
	n.Detach(ctx, id) //nolint:errcheck // best effort: the attach's error is returned
}

// Detach tears the sandbox of replica id down: CNI DEL (releases the
// address and the veth) and removes the pinned namespace. It is
// idempotent: detaching a sandbox that is gone, or half-built, succeeds.
func (n *Network) Detach(ctx context.Context, id string) error {
	rt := n.runtimeConf(id)
	if !isNetNS(rt.NetNS) {
		// The namespace is gone (or was never mounted): DEL must still
		// release the IPAM reservation; plugins accept an empty netns.
		rt.NetNS = ""
	}
	var errs []error
	if bridge, err := n.bridgeConf(); err == nil {
		if err := n.cni.DelNetworkList(ctx, bridge, rt); err != nil {
			errs = append(errs, fmt.Errorf("CNI bridge DEL: %w", err))
		}
	}
	if rt.NetNS != "" {
		if err := n.cni.DelNetworkList(ctx, n.loopback, rt); err != nil {
			errs = append(errs, fmt.Errorf("CNI loopback DEL: %w", err))
		}
	}
	if err := removeNetNS(n.NetNSPath(id)); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// Ready reports whether the sandbox of id has its network namespace
// mounted. After a host reboot the pin files remain but the namespaces
// are gone: such a sandbox must be rebuilt.
func (n *Network) Ready(id string) bool { return isNetNS(n.NetNSPath(id)) }

// Sandboxes lists the IDs of pinned sandbox namespaces, sorted. The
// runtime compares them with its containers to clean up sandboxes whose
// container was never created (the agent died in between).
func (n *Network) Sandboxes() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(n.cfg.DataDir, "netns"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	sort.Strings(ids)
	return ids, nil
}

// Reservations lists the pod IPs host-local IPAM holds on this node.
func (n *Network) Reservations() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(n.cfg.DataDir, "ipam", networkName))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ips []string
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			ips = append(ips, e.Name())
		}
	}
	return ips, nil
}
