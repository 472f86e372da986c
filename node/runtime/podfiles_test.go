package runtime

import (
	"strings"
	"testing"

	"github.com/starling-orchestrator/starling/node/dns"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// TestHostsFile: localhost, the replica under its name (and FQDN with a
// subdomain), then hostAliases, as the kubelet writes them.
func TestHostsFile(t *testing.T) {
	got := string(hostsFile("10.22.1.5", "web", "sub", "shop", []reconcile.HostAlias{{IP: "10.9.9.9", Hostnames: []string{"db.lan", "db"}}}))
	for _, line := range []string{"127.0.0.1\tlocalhost\n", "::1\tlocalhost ip6-localhost ip6-loopback\n",
		"10.22.1.5\tweb.sub.shop.svc.cluster.local\tweb\n", "# Entries added by HostAliases.\n10.9.9.9\tdb.lan\tdb\n"} {
		if !strings.Contains(got, line) {
			t.Errorf("hosts file lacks %q:\n%s", line, got)
		}
	}
	if got := string(hostsFile("10.22.1.5", "web-0", "", "shop", nil)); !strings.HasSuffix(got, "10.22.1.5\tweb-0\n") || strings.Contains(got, "HostAliases") {
		t.Errorf("hosts file without subdomain or aliases:\n%s", got)
	}
}

// TestResolvConfOfClusterFirst: with the node's DNS, ClusterFirst (and
// the empty default) names it, the cluster's search path before the
// node's, ndots:5; Default keeps the node's settings; dnsConfig merges
// in as for the others.
func TestResolvConfOfClusterFirst(t *testing.T) {
	node := dns.Resolver{Nameservers: []string{"192.168.1.1"}, Searches: []string{"home.arpa"}, Options: []string{"edns0"}}
	r := &Runtime{cfg: Config{ClusterDomain: "cluster.local", PodSubnetBits: 24}}
	cluster := r.clusterDNS("10.22.7.12", "shop")
	for _, tt := range []struct {
		policy string
		cfg    *reconcile.DNSConfig
		want   string
	}{
		{"", nil, "nameserver 10.22.7.1\nsearch shop.svc.cluster.local svc.cluster.local cluster.local home.arpa\noptions ndots:5\n"},
		{"ClusterFirst", &reconcile.DNSConfig{Searches: []string{"lan"}}, "nameserver 10.22.7.1\nsearch shop.svc.cluster.local svc.cluster.local cluster.local home.arpa lan\noptions ndots:5\n"},
		{"Default", nil, "nameserver 192.168.1.1\nsearch home.arpa\noptions edns0\n"},
	} {
		got := strings.TrimPrefix(string(resolvConf(node, tt.policy, tt.cfg, cluster)), "# Starling-managed resolv.conf.\n")
		if got != tt.want {
			t.Errorf("%q: got\n%s\nwant\n%s", tt.policy, got, tt.want)
		}
	}
	if (&Runtime{}).clusterDNS("10.22.7.12", "shop") != nil {
		t.Error("no cluster domain: want the node's settings")
	}
}

// TestResolvConf: Default and ClusterFirst take the node's settings,
// None only dnsConfig; dnsConfig is appended without duplicates, at most
// 3 nameservers, an option replacing one of its name.
func TestResolvConf(t *testing.T) {
	node := dns.Resolver{Nameservers: []string{"192.168.1.1"}, Searches: []string{"home.arpa"}, Options: []string{"ndots:1", "edns0"}}
	two := "2"
	cfg := &reconcile.DNSConfig{Nameservers: []string{"192.0.2.53", "192.168.1.1", "192.0.2.54", "192.0.2.55"},
		Searches: []string{"lan", "home.arpa"}, Options: []reconcile.DNSOption{{Name: "ndots", Value: &two}, {Name: "rotate"}}}
	for _, tt := range []struct {
		policy string
		cfg    *reconcile.DNSConfig
		want   string
	}{
		{"Default", nil, "nameserver 192.168.1.1\nsearch home.arpa\noptions ndots:1 edns0\n"},
		{"", nil, "nameserver 192.168.1.1\nsearch home.arpa\noptions ndots:1 edns0\n"},
		{"ClusterFirst", cfg, "nameserver 192.168.1.1\nnameserver 192.0.2.53\nnameserver 192.0.2.54\nsearch home.arpa lan\noptions edns0 ndots:2 rotate\n"},
		{"None", &reconcile.DNSConfig{Nameservers: []string{"192.0.2.53"}}, "nameserver 192.0.2.53\n"},
	} {
		got := strings.TrimPrefix(string(resolvConf(node, tt.policy, tt.cfg, nil)), "# Starling-managed resolv.conf.\n")
		if got != tt.want {
			t.Errorf("%s: got\n%s\nwant\n%s", tt.policy, got, tt.want)
		}
	}
}
