package runtime

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/starling-orchestrator/starling/node/dns"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// A replica's /etc/hosts, /etc/hostname and /etc/resolv.conf, made as
// the kubelet makes a pod's (kubelet_pods.go managedHostsFileContent,
// pkg/kubelet/network/dns) and bind-mounted over the image's, as CRI
// mounts the sandbox's.

// ClusterDomain is the DNS domain of the cluster's names
// (<hostname>.<subdomain>.<namespace>.svc.<ClusterDomain>).
const ClusterDomain = "cluster.local"

// hostsFile returns the replica's /etc/hosts: localhost, the IPv6
// names, the replica's address under its host name (and its FQDN with a
// subdomain), then the hostAliases.
func hostsFile(podIP, hostname, subdomain, namespace string, aliases []reconcile.HostAlias) []byte {
	var b bytes.Buffer
	b.WriteString("# Starling-managed hosts file.\n")
	b.WriteString("127.0.0.1\tlocalhost\n")
	b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
	b.WriteString("fe00::0\tip6-localnet\n")
	b.WriteString("fe00::0\tip6-mcastprefix\n")
	b.WriteString("fe00::1\tip6-allnodes\n")
	b.WriteString("fe00::2\tip6-allrouters\n")
	if subdomain != "" {
		fmt.Fprintf(&b, "%s\t%s.%s.%s.svc.%s\t%s\n", podIP, hostname, subdomain, namespace, ClusterDomain, hostname)
	} else {
		fmt.Fprintf(&b, "%s\t%s\n", podIP, hostname)
	}
	if len(aliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range aliases {
			fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	return b.Bytes()
}

// resolvConf returns the replica's /etc/resolv.conf for its dnsPolicy:
// "ClusterFirst" (and "" and "ClusterFirstWithHostNet") the node's DNS
// with the cluster's search path before the node's and ndots:5
// (cluster; nil when the node serves no cluster DNS: the node's
// settings), "Default" the node's settings, "None" none; then dnsConfig
// is merged in as the kubelet does (nameservers and searches appended without duplicates,
// at most 3 nameservers; an option replaces one of the same name).
func resolvConf(node dns.Resolver, policy string, cfg *reconcile.DNSConfig, cluster *dns.Resolver) []byte {
	var r dns.Resolver
	switch {
	case policy == "None":
	case cluster != nil && policy != "Default":
		r = dns.Resolver{Nameservers: slices.Clone(cluster.Nameservers), Searches: appendNew(slices.Clone(cluster.Searches), node.Searches...),
			Options: slices.Clone(cluster.Options)}
	default:
		r = dns.Resolver{Nameservers: slices.Clone(node.Nameservers), Searches: slices.Clone(node.Searches), Options: slices.Clone(node.Options)}
	}
	if cfg != nil {
		r.Nameservers = appendNew(r.Nameservers, cfg.Nameservers...)
		r.Searches = appendNew(r.Searches, cfg.Searches...)
		for _, o := range cfg.Options {
			opt := o.Name
			if o.Value != nil {
				opt += ":" + *o.Value
			}
			r.Options = slices.DeleteFunc(r.Options, func(have string) bool {
				name, _, _ := strings.Cut(have, ":")
				return name == o.Name
			})
			r.Options = append(r.Options, opt)
		}
	}
	if len(r.Nameservers) > 3 {
		r.Nameservers = r.Nameservers[:3]
	}
	var b bytes.Buffer
	b.WriteString("# Starling-managed resolv.conf.\n")
	for _, ns := range r.Nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", ns)
	}
	if len(r.Searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(r.Searches, " "))
	}
	if len(r.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(r.Options, " "))
	}
	return b.Bytes()
}

func appendNew(list []string, add ...string) []string {
	for _, a := range add {
		if !slices.Contains(list, a) {
			list = append(list, a)
		}
	}
	return list
}

// clusterDNS is what the resolv.conf of a ClusterFirst pod at podIP in
// namespace names (resolvConf): the node's DNS, at its pod subnet's
// gateway, the cluster's search path and ndots:5, as the kubelet writes
// it; nil when the node serves no cluster DNS.
func (r *Runtime) clusterDNS(podIP, namespace string) *dns.Resolver {
	ip, err := netip.ParseAddr(podIP)
	if r.cfg.ClusterDomain == "" || err != nil {
		return nil
	}
	ns, err := dns.Nameserver(netip.PrefixFrom(ip, r.cfg.PodSubnetBits))
	if err != nil {
		return nil
	}
	d := r.cfg.ClusterDomain
	return &dns.Resolver{Nameservers: []string{ns.String()}, Searches: []string{namespace + ".svc." + d, "svc." + d, d}, Options: []string{"ndots:5"}}
}

// podFiles writes the replica's hosts, hostname and resolv.conf into dir
// (made, 0755: the container's user must read them) and returns their
// mounts.
func podFiles(dir, podIP, hostname string, rep reconcile.Replica, node dns.Resolver, cluster *dns.Resolver) ([]specs.Mount, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	files := []struct {
		name, dest string
		data       []byte
	}{
		{"hosts", "/etc/hosts", hostsFile(podIP, hostname, rep.Spec.Subdomain, rep.Namespace, rep.Spec.HostAliases)},
		{"hostname", "/etc/hostname", []byte(hostname + "\n")},
		{"resolv.conf", "/etc/resolv.conf", resolvConf(node, rep.Spec.DNSPolicy, rep.Spec.DNSConfig, cluster)},
	}
	var mounts []specs.Mount
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		// A container added to a running replica finds the files made:
		// rewritten in place, they would read empty for a moment in the
		// containers that run.
		if old, err := os.ReadFile(path); err != nil || !bytes.Equal(old, f.data) {
			if err := os.WriteFile(path, f.data, 0o644); err != nil {
				return nil, err
			}
		}
		mounts = append(mounts, specs.Mount{Destination: f.dest, Type: "bind", Source: path, Options: []string{"rbind", "rprivate", "rw"}})
	}
	return mounts, nil
}
