// Package node wires Starling's layers into the agent that runs on every
// node: the desired-state store, the pure reconcile core, the containerd
// runtime, the pod network and the HTTP API.
package node

import (
	"fmt"
	"net"
	"os"
	"time"

	"github.com/starling-orchestrator/starling/net/podnet"
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
	// PodSubnet is this node's pod address range (a /24 of ClusterCIDR).
	PodSubnet string
	// ClusterCIDR is the address space of all pods in the cluster.
	ClusterCIDR string
	// CNIPluginDirs are searched for the CNI plugin binaries.
	CNIPluginDirs []string
	// APIListen, when set ("ADDR:PORT"), serves the API on TCP too; it then
	// requires TokenFile.
	APIListen string
	// TokenFile holds the bearer token TCP clients must present.
	TokenFile string
	// ResyncInterval is how often reconcile runs without any change.
	ResyncInterval time.Duration
}

// DefaultConfig returns the defaults documented in the README.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Name:              host,
		DataDir:           "/var/lib/starling",
		ContainerdAddress: "/run/containerd/containerd.sock",
		Snapshotter:       "overlayfs",
		PodSubnet:         "10.22.1.0/24",
		ClusterCIDR:       "10.22.0.0/16",
		CNIPluginDirs:     podnet.DefaultPluginDirs,
		ResyncInterval:    5 * time.Second,
	}
}

// SocketPath is the API's unix socket inside dataDir.
func SocketPath(dataDir string) string { return dataDir + "/starling.sock" }

// validate checks the configuration and returns the parsed networks.
// Errors name the flag to fix.
func (c Config) validate() (pod, cluster *net.IPNet, err error) {
	if c.Name == "" {
		return nil, nil, fmt.Errorf("--name: must not be empty")
	}
	_, cluster, err = net.ParseCIDR(c.ClusterCIDR)
	if err != nil || cluster.IP.To4() == nil {
		return nil, nil, fmt.Errorf("--cluster-cidr %q: must be an IPv4 CIDR such as 10.22.0.0/16", c.ClusterCIDR)
	}
	_, pod, err = net.ParseCIDR(c.PodSubnet)
	if err != nil || pod.IP.To4() == nil {
		return nil, nil, fmt.Errorf("--pod-subnet %q: must be an IPv4 CIDR such as 10.22.1.0/24", c.PodSubnet)
	}
	if ones, _ := pod.Mask.Size(); ones > 29 {
		return nil, nil, fmt.Errorf("--pod-subnet %q: too small, use a /24", c.PodSubnet)
	}
	if cOnes, _ := cluster.Mask.Size(); !cluster.Contains(pod.IP) || func() bool { p, _ := pod.Mask.Size(); return p < cOnes }() {
		return nil, nil, fmt.Errorf("--pod-subnet %s: must lie inside --cluster-cidr %s", c.PodSubnet, c.ClusterCIDR)
	}
	if c.APIListen != "" && c.TokenFile == "" {
		return nil, nil, fmt.Errorf("--api-listen %s: requires --token-file (TCP clients must present a bearer token)", c.APIListen)
	}
	if c.ResyncInterval <= 0 {
		return nil, nil, fmt.Errorf("resync interval must be positive")
	}
	return pod, cluster, nil
}
