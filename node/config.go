// Package node wires Starling's layers into the agent that runs on every
// node: the desired-state store, the pure reconcile core, the containerd
// runtime, the pod network and the HTTP API.
package node

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	metavalidation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/starling-orchestrator/starling/net/podnet"
	"github.com/starling-orchestrator/starling/node/dataplane"
	"github.com/starling-orchestrator/starling/node/ingress"
	"github.com/starling-orchestrator/starling/node/logfile"
)

// Config is the agent's configuration: one field per knob, units in the
// names. DefaultConfig returns the defaults the CLI flags start from.
type Config struct {
	// Name identifies the node in the cluster (default: the hostname).
	Name string
	// DataDir holds the store, logs, sandboxes and the API socket.
	DataDir string
	// ContainerdAddress is containerd's gRPC socket.
	ContainerdAddress string
	// Snapshotter for container root filesystems.
	Snapshotter string
	// ProxyMode is how Service rules are written: dataplane.ProxyAuto (""),
	// dataplane.ProxyIptables or dataplane.ProxyNftables (dataplane.ServiceSyncer).
	ProxyMode string
	// CgroupParent is the cgroup under which each replica's container gets
	// its own; default /starling/<name>.
	CgroupParent string
	// RuncRoot is runc's state directory for this node's containers (on
	// tmpfs, so it does not outlive a reboot); default /run/starling/<name>/runc.
	RuncRoot string
	// PodSubnet, when set, is this node's pod address range (a /24 of
	// ClusterCIDR) chosen by hand; empty (the default) lets the node claim
	// a free /24 by itself (net/ipam) and keep it across restarts.
	PodSubnet string
	// SubnetSettle is how long a new subnet claim must stand without a
	// conflict before the node runs pods on it.
	SubnetSettle time.Duration
	// SubnetReclaimAfter is how long the subnet of a dead node stays
	// reserved ("starling node forget" frees it at once).
	SubnetReclaimAfter time.Duration
	// ClusterCIDR is the address space of all pods in the cluster.
	ClusterCIDR string
	// ServiceCIDR is where ClusterIPs come from.
	ServiceCIDR string
	// CNIPluginDirs are searched for the CNI plugin binaries.
	CNIPluginDirs []string
	// APIListen, when set ("ADDR:PORT"), serves the API on TCP too; it then
	// requires TokenFile.
	APIListen string
	// TokenFile holds the bearer token TCP clients must present.
	TokenFile string
	// ResyncInterval is how often reconcile runs without any change.
	ResyncInterval time.Duration

	// BindAddr is the gossip listen address, "IP:PORT" (TCP and UDP).
	BindAddr string
	// Advertise is the address peers reach this node at ("IP" or
	// "IP:PORT"); empty lets memberlist pick the bind or a private address.
	Advertise string
	// Join are seed addresses ("HOST" or "HOST:PORT"); any one suffices.
	Join []string
	// JoinTokenFile holds a join token ('starling join-token'); a node
	// that is not yet a member of a cluster joins with it through Join.
	// Once joined, the node keeps its credentials in DataDir (node/trust/pki.go) and
	// the token is not needed again. The file must not be readable by
	// group or others.
	JoinTokenFile string
	// Insecure runs the node with no cluster CA, gossip key or join
	// token: gossip in the clear, readable and writable by anyone on the
	// LAN (every record is still signed by its node's key). The agent
	// logs a WARN at start and every insecureWarnInterval, and `get
	// nodes` shows it.
	Insecure bool
	// MaxImageBytes bounds one image import (the tarball's bytes, through
	// the API or from a peer); a larger one is refused with 413.
	MaxImageBytes int64
	// TombstoneTTL is how long deletes are remembered; a node away longer
	// discards its desired state and resyncs.
	TombstoneTTL time.Duration
	// HandoffTimeout bounds make-before-break when a replica moves to a
	// node that joined.
	HandoffTimeout time.Duration
	// AckTimeout is how long a node may list none of the Deployment
	// replicas placed on it in its status before placement leaves the
	// node out for a while (node/view/unresponsive.go); keep it below
	// HandoffTimeout so a moved replica's old copy still runs when that
	// happens. 0 turns the check off.
	AckTimeout time.Duration
	// FenceWatchdog runs the fence watchdog (watchdog.go), which kills
	// this node's StatefulSet replicas when the agent stops renewing its
	// lease; off only for in-process tests.
	FenceWatchdog bool
	// PidsLimit bounds the processes of each container (the pids
	// cgroup); 0 means no limit.
	PidsLimit int64
	// AllowHostPath are the directories under which hostPath volumes
	// may lie (absolute, clean); none allows none.
	AllowHostPath []string
	// InsecureRegistries are registries pulled from over plain HTTP.
	InsecureRegistries []string
	// ClusterDomain is the cluster's DNS domain; ClusterDNS serves it on
	// the node (node/names) and points ClusterFirst pods at it;
	// ResolvConf names the node's resolvers (forwarded to; pods with
	// dnsPolicy Default get them).
	ClusterDomain, ResolvConf string
	ClusterDNS                bool
	// IngressHTTP and IngressHTTPS are where the node serves Ingresses
	// (node/ingress), "host:port"; "" serves none on that scheme.
	IngressHTTP, IngressHTTPS string
	// ACMEDirectory is the ACME server Ingresses annotated for it get
	// certificates from ("": none), ACMEEmail its account's contact,
	// ACMECA a PEM file of roots its HTTPS is verified with.
	ACMEDirectory, ACMEEmail, ACMECA string
	// LogDriver is the starling binary (an absolute path) containerd's
	// shim runs as each container's log writer (logfile.Main); empty
	// has the shim append raw output to the log file (in-process tests).
	LogDriver string
	// LogMaxSize (bytes) and LogMaxFiles rotate each container's log, as
	// the kubelet's --container-log-max-size and -files do.
	LogMaxSize  int64
	LogMaxFiles int
	// RejoinSettle is how long a node that was dead or left must be back
	// before placement gives it replicas again (flap damping).
	RejoinSettle time.Duration
	// FailoverTimeout is how long a StatefulSet replica stays reserved for
	// a node that went down (dead or left) before another node may start
	// it. It must stay well above the time a cut-off node takes to fence
	// itself (see node/fence.go: failure detection plus a SIGKILL, ~5 s
	// with the LAN defaults).
	FailoverTimeout time.Duration
	// FenceTimeout is how long a node may go without hearing from a
	// majority of the cluster's known nodes (answers to its quorum questions: node/quorum, a round every 250 ms to 1 s)
	// before it kills its StatefulSet replicas. FailoverTimeout must
	// exceed it by at least 5 s.
	FenceTimeout time.Duration
	// DrainDelay is how long a running replica stays up, already out of
	// every node's Service endpoints, before it gets SIGTERM on a remove
	// or replace (gossip reaches all nodes in well under a second on a
	// LAN); 0 stops at once.
	DrainDelay time.Duration
	// Labels are this node's labels, matched by nodeSelector.
	Labels map[string]string

	// ProbeInterval is the time between failure-detection probes (SWIM);
	// ProbeTimeout the wait for an ack before indirect probes; a node that
	// stays unreachable is declared dead after about SuspicionMult *
	// max(1, log10(N)) * ProbeInterval. Zero values mean memberlist's LAN
	// defaults (1 s, 500 ms, 4).
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	SuspicionMult int

	// DryRun joins the cluster but claims no subnet, runs no container
	// and changes nothing in the network namespace; it prints, when they
	// change, the subnet, routes and Service rules it would install.
	DryRun bool
}

// clusterDNSDomain is the domain pods' ClusterFirst resolv.conf names
// with the node's DNS as their nameserver, when the node serves it (a
// real pod network, ClusterDNS on); "" when it does not.
func (c Config) clusterDNSDomain(podNetwork bool) string {
	if !podNetwork || !c.ClusterDNS || c.DryRun {
		return ""
	}
	return c.ClusterDomain
}

// DefaultConfig returns the defaults documented in the README.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Name:               host,
		DataDir:            "/var/lib/starling",
		ContainerdAddress:  "/run/containerd/containerd.sock",
		Snapshotter:        "overlayfs",
		SubnetSettle:       3 * time.Second,
		SubnetReclaimAfter: 24 * time.Hour,
		ClusterCIDR:        "10.22.0.0/16",
		ServiceCIDR:        "10.23.0.0/16",
		CNIPluginDirs:      podnet.DefaultPluginDirs,
		ResyncInterval:     5 * time.Second,
		BindAddr:           "0.0.0.0:7946",
		TombstoneTTL:       72 * time.Hour,
		HandoffTimeout:     60 * time.Second,
		AckTimeout:         30 * time.Second,
		PidsLimit:          4096,
		ClusterDomain:      "cluster.local",
		ResolvConf:         "/etc/resolv.conf",
		ClusterDNS:         true,
		IngressHTTP:        ":80",
		IngressHTTPS:       ":443",
		ACMEDirectory:      "https://acme-v02.api.letsencrypt.org/directory",
		LogMaxSize:         logfile.DefaultMaxSize,
		LogMaxFiles:        logfile.DefaultMaxFiles,
		FenceWatchdog:      true,
		RejoinSettle:       10 * time.Second,
		FailoverTimeout:    15 * time.Second,
		FenceTimeout:       3 * time.Second,
		DrainDelay:         time.Second,
		MaxImageBytes:      4 << 30,
	}
}

// SocketPath is the API's unix socket inside dataDir.
func SocketPath(dataDir string) string { return dataDir + "/starling.sock" }

// validate checks the configuration and returns the parsed networks.
// Errors name the flag to fix.
func (c Config) validate() (pod, cluster *net.IPNet, err error) {
	if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 {
		return nil, nil, fmt.Errorf("--name %q: %s (a node name is a DNS label such as node-1)", c.Name, strings.Join(errs, "; "))
	}
	_, cluster, err = net.ParseCIDR(c.ClusterCIDR)
	if err != nil || cluster.IP.To4() == nil {
		return nil, nil, fmt.Errorf("--cluster-cidr %q: must be an IPv4 CIDR such as 10.22.0.0/16", c.ClusterCIDR)
	}
	if c.PodSubnet == "" {
		if ones, _ := cluster.Mask.Size(); ones >= 24 {
			return nil, nil, fmt.Errorf("--cluster-cidr %s: must be larger than a /24 so nodes can claim /24s", c.ClusterCIDR)
		}
		return nil, cluster, c.validateRest()
	}
	_, pod, err = net.ParseCIDR(c.PodSubnet)
	if err != nil || pod.IP.To4() == nil {
		return nil, nil, fmt.Errorf("--pod-subnet %q: must be an IPv4 CIDR such as 10.22.1.0/24", c.PodSubnet)
	}
	if pod.String() != c.PodSubnet {
		return nil, nil, fmt.Errorf("--pod-subnet %q: host bits are set; did you mean %s?", c.PodSubnet, pod)
	}
	ones, _ := pod.Mask.Size()
	cOnes, _ := cluster.Mask.Size()
	if ones > 28 {
		return nil, nil, fmt.Errorf("--pod-subnet %q: too small, use a /24", c.PodSubnet)
	}
	if !cluster.Contains(pod.IP) || ones <= cOnes {
		return nil, nil, fmt.Errorf("--pod-subnet %s: must be a smaller range inside --cluster-cidr %s (e.g. a /24)", c.PodSubnet, c.ClusterCIDR)
	}
	return pod, cluster, c.validateRest()
}

func (c Config) validateRest() error {
	switch c.ProxyMode {
	case dataplane.ProxyAuto, dataplane.ProxyIptables, dataplane.ProxyNftables:
	default:
		return fmt.Errorf("--proxy-mode %q: use nftables, iptables, or leave it empty to choose by the host", c.ProxyMode)
	}
	if _, n, err := net.ParseCIDR(c.ServiceCIDR); err != nil || n.IP.To4() == nil {
		return fmt.Errorf("--service-cidr %q: must be an IPv4 CIDR such as 10.23.0.0/16", c.ServiceCIDR)
	}
	if errs := metavalidation.ValidateLabels(c.Labels, field.NewPath("--node-label")); len(errs) > 0 {
		return fmt.Errorf("%v (peers refuse a node record with such labels)", errs.ToAggregate())
	}
	if c.MaxImageBytes <= 0 {
		return fmt.Errorf("--max-image-size %d: must be positive, e.g. 4GiB", c.MaxImageBytes)
	}
	if c.APIListen != "" && c.TokenFile == "" {
		return fmt.Errorf("--api-listen %s: requires --token-file (TCP clients must present a bearer token)", c.APIListen)
	}
	if c.FenceTimeout < time.Second || c.FenceTimeout > 10*time.Second {
		return fmt.Errorf("--fence-timeout %v: must be between 1s (peers are asked once a second) and 10s (quorum evidence is told apart up to 12.75 s)", c.FenceTimeout)
	}
	if c.FailoverTimeout < c.FenceTimeout+5*time.Second {
		return fmt.Errorf("--failover-timeout %v: must be at least --fence-timeout (%v) + 5s, so a cut-off node has fenced itself before its replicas start elsewhere", c.FailoverTimeout, c.FenceTimeout)
	}
	if c.LogMaxSize < 1<<10 {
		return fmt.Errorf("--container-log-max-size %d: must be at least 1KiB, e.g. 10MiB", c.LogMaxSize)
	}
	if c.LogMaxFiles < 1 {
		return fmt.Errorf("--container-log-max-files %d: must be at least 1 (the file being written)", c.LogMaxFiles)
	}
	if errs := validation.IsDNS1123Subdomain(c.ClusterDomain); len(errs) > 0 {
		return fmt.Errorf("--cluster-domain %q: %s (e.g. cluster.local)", c.ClusterDomain, strings.Join(errs, "; "))
	}
	for flag, addr := range map[string]string{"--ingress-http": c.IngressHTTP, "--ingress-https": c.IngressHTTPS} {
		if _, port, err := net.SplitHostPort(addr); addr != "" && (err != nil || port == "0") {
			return fmt.Errorf("%s %q: want HOST:PORT or :PORT (e.g. :80), or \"\" to serve no Ingress on it", flag, addr)
		}
	}
	if _, err := ingress.LoadRoots(c.ACMECA); c.ACMEDirectory != "" && err != nil {
		return err
	}
	if c.PidsLimit < 0 {
		return fmt.Errorf("--pids-limit %d: must be 0 (no limit) or more", c.PidsLimit)
	}
	for _, p := range c.AllowHostPath {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("--allow-host-path %q: give an absolute, clean directory other than /", p)
		}
	}
	if c.AckTimeout != 0 && c.AckTimeout < time.Second {
		return fmt.Errorf("--ack-timeout %v: must be 0 (off) or at least 1s (nodes list new replicas within a reconcile pass)", c.AckTimeout)
	}
	if c.ResyncInterval <= 0 {
		return fmt.Errorf("--resync-interval %v: must be positive, e.g. 5s", c.ResyncInterval)
	}
	return nil
}
