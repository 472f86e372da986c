package podnet

import (
	"errors"
	"fmt"
	"os"

	"github.com/coreos/go-iptables/iptables"
)

// hostSysctls are the host sysctls the pod network needs in the node's network namespace.
// bridge-nf-call-iptables makes bridged pod-to-pod traffic pass netfilter,
// so Service DNAT and its reverse work for same-node backends (see
// kernel Documentation/networking/ip-sysctl.rst and br_netfilter).
var hostSysctls = map[string]string{
	"/proc/sys/net/ipv4/ip_forward":                "1",
	"/proc/sys/net/bridge/bridge-nf-call-iptables": "1",
}

// MasqueradeChain is the nat chain, jumped to from POSTROUTING, in which
// the agent masquerades pod traffic that leaves the cluster CIDR.
const MasqueradeChain = "STARLING-POD-MASQ"

// MasqueradeComment marks the masquerade rule in MasqueradeChain.
const MasqueradeComment = "starling: pod traffic leaving the cluster CIDR"

// PrepareHost sets the sysctls above in the agent's network namespace and
// installs the masquerade rule: "-s <pod subnet> ! -d <cluster CIDR> -j
// MASQUERADE". Traffic between pod subnets keeps its source address. It is
// idempotent and touches only Starling's own chain and jump rule. Errors
// name the sysctl or iptables call that failed; a missing
// /proc/sys/net/bridge means br_netfilter is not loaded.
func (n *Network) PrepareHost() error {
	n.hostMu.Lock()
	defer n.hostMu.Unlock()
	err := n.prepareHost()
	n.prepared = n.prepared || err == nil
	return err
}

func (n *Network) prepareHost() error {
	for path, val := range hostSysctls {
		if err := os.WriteFile(path, []byte(val), 0o644); err != nil {
			if os.IsNotExist(err) && path != "/proc/sys/net/ipv4/ip_forward" {
				return fmt.Errorf("sysctl %s: %w (load the br_netfilter kernel module: modprobe br_netfilter)", path, err)
			}
			return fmt.Errorf("sysctl %s: %w", path, err)
		}
	}
	ipt, err := n.iptables()
	if err != nil {
		return err
	}
	if ok, err := ipt.ChainExists("nat", MasqueradeChain); err != nil {
		return fmt.Errorf("iptables nat %s: %w", MasqueradeChain, err)
	} else if !ok {
		if err := ipt.NewChain("nat", MasqueradeChain); err != nil {
			return fmt.Errorf("iptables create nat %s: %w", MasqueradeChain, err)
		}
	}
	rule, err := n.masqueradeRule()
	if err != nil {
		return err
	}
	if err := ipt.ClearChain("nat", MasqueradeChain); err != nil {
		return fmt.Errorf("iptables flush nat %s: %w", MasqueradeChain, err)
	}
	if err := ipt.Append("nat", MasqueradeChain, rule...); err != nil {
		return fmt.Errorf("iptables nat %s masquerade rule: %w", MasqueradeChain, err)
	}
	if err := ipt.AppendUnique("nat", "POSTROUTING", masqueradeJump...); err != nil {
		return fmt.Errorf("iptables nat POSTROUTING jump: %w", err)
	}
	return nil
}

var masqueradeJump = []string{"-m", "comment", "--comment", "starling: pod masquerade", "-j", MasqueradeChain}

func (n *Network) iptables() (*iptables.IPTables, error) {
	cmd := n.cfg.Iptables
	if cmd == "" {
		cmd = "iptables"
	}
	ipt, err := iptables.New(iptables.Path(cmd), iptables.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("%s: %w (install the Debian package iptables)", cmd, err)
	}
	return ipt, nil
}

// masqueradeRule is the rule of MasqueradeChain for the node's subnet.
func (n *Network) masqueradeRule() ([]string, error) {
	n.mu.Lock()
	subnet := n.cfg.PodSubnet
	n.mu.Unlock()
	if subnet == nil {
		return nil, errors.New("podnet: the node has no pod subnet yet")
	}
	return []string{"-s", subnet.String(), "!", "-d", n.cfg.ClusterCIDR.String(),
		"-m", "comment", "--comment", MasqueradeComment, "-j", "MASQUERADE"}, nil
}

// KeepHost checks (two iptables calls) that the masquerade rule and the
// jump to it are still in place, and runs PrepareHost again when they
// are not (someone flushed the nat table, or `nft flush ruleset` ran).
// It reports whether it repaired anything. Before the node has a subnet
// it does nothing, and so before PrepareHost first succeeded.
func (n *Network) KeepHost() (bool, error) {
	n.hostMu.Lock()
	defer n.hostMu.Unlock()
	if !n.prepared {
		return false, nil
	}
	rule, err := n.masqueradeRule()
	if err != nil {
		return false, nil
	}
	ipt, err := n.iptables()
	if err != nil {
		return false, err
	}
	ok, err := ipt.Exists("nat", MasqueradeChain, rule...)
	if err == nil && ok {
		ok, err = ipt.Exists("nat", "POSTROUTING", masqueradeJump...)
	}
	if err == nil && ok {
		return false, nil
	}
	return true, n.prepareHost()
}
