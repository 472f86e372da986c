package runtime

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
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

// resolver is a parsed resolv.conf: what the pod's is made of.
type resolver struct {
	nameservers, searches, options []string
}

// parseResolvConf reads nameserver, search/domain and options lines
// (resolv.conf(5)); other lines and comments are ignored.
func parseResolvConf(b []byte) resolver {
	var r resolver
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line, _, _ = strings.Cut(line, ";")
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			r.nameservers = append(r.nameservers, f[1])
		case "search", "domain": // the last of them wins, as in glibc
			r.searches = slices.Clone(f[1:])
		case "options":
			r.options = append(r.options, f[1:]...)
		}
	}
	return r
}

// nodeResolver returns the node's resolver settings as a pod may use
// them: those of hostConf (normally /etc/resolv.conf) without loopback
// nameservers, which answer only inside the node's own network
// namespace. When that leaves none (systemd-resolved's stub, 127.0.0.53)
// and upstream (its list of real servers,
// /run/systemd/resolve/resolv.conf) can be read, those are used, as
// Kubernetes advises for the kubelet's --resolv-conf.
func nodeResolver(hostConf, upstream string) (resolver, error) {
	b, err := os.ReadFile(hostConf)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return resolver{}, err
	}
	r := parseResolvConf(b)
	r.nameservers = slices.DeleteFunc(r.nameservers, isLoopback)
	if len(r.nameservers) == 0 {
		if ub, err := os.ReadFile(upstream); err == nil {
			u := parseResolvConf(ub)
			u.nameservers = slices.DeleteFunc(u.nameservers, isLoopback)
			if len(u.searches) == 0 {
				u.searches = r.searches
			}
			return u, nil
		}
	}
	return r, nil
}

func isLoopback(s string) bool {
	a, err := netip.ParseAddr(s)
	return err != nil || a.IsLoopback()
}

// resolvConf returns the replica's /etc/resolv.conf for its dnsPolicy:
// "Default" (and "ClusterFirst", until Starling serves cluster DNS) the
// node's settings, "None" none; then dnsConfig is merged in as the
// kubelet does (nameservers and searches appended without duplicates,
// at most 3 nameservers; an option replaces one of the same name).
func resolvConf(node resolver, policy string, cfg *reconcile.DNSConfig) []byte {
	var r resolver
	if policy != "None" {
		r = resolver{slices.Clone(node.nameservers), slices.Clone(node.searches), slices.Clone(node.options)}
	}
	if cfg != nil {
		r.nameservers = appendNew(r.nameservers, cfg.Nameservers...)
		r.searches = appendNew(r.searches, cfg.Searches...)
		for _, o := range cfg.Options {
			opt := o.Name
			if o.Value != nil {
				opt += ":" + *o.Value
			}
			r.options = slices.DeleteFunc(r.options, func(have string) bool {
				name, _, _ := strings.Cut(have, ":")
				return name == o.Name
			})
			r.options = append(r.options, opt)
		}
	}
	if len(r.nameservers) > 3 {
		r.nameservers = r.nameservers[:3]
	}
	var b bytes.Buffer
	b.WriteString("# Starling-managed resolv.conf.\n")
	for _, ns := range r.nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", ns)
	}
	if len(r.searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(r.searches, " "))
	}
	if len(r.options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(r.options, " "))
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

// podFiles writes the replica's hosts, hostname and resolv.conf into dir
// (made, 0755: the container's user must read them) and returns their
// mounts.
func podFiles(dir, podIP, hostname string, rep reconcile.Replica, node resolver) ([]specs.Mount, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	files := []struct {
		name, dest string
		data       []byte
	}{
		{"hosts", "/etc/hosts", hostsFile(podIP, hostname, rep.Spec.Subdomain, rep.Namespace, rep.Spec.HostAliases)},
		{"hostname", "/etc/hostname", []byte(hostname + "\n")},
		{"resolv.conf", "/etc/resolv.conf", resolvConf(node, rep.Spec.DNSPolicy, rep.Spec.DNSConfig)},
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
