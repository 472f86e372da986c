package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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

// TestResolvConf: Default and ClusterFirst take the node's settings,
// None only dnsConfig; dnsConfig is appended without duplicates, at most
// 3 nameservers, an option replacing one of its name.
func TestResolvConf(t *testing.T) {
	node := resolver{nameservers: []string{"192.168.1.1"}, searches: []string{"home.arpa"}, options: []string{"ndots:1", "edns0"}}
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
		got := strings.TrimPrefix(string(resolvConf(node, tt.policy, tt.cfg)), "# Starling-managed resolv.conf.\n")
		if got != tt.want {
			t.Errorf("%s: got\n%s\nwant\n%s", tt.policy, got, tt.want)
		}
	}
}

// TestNodeResolverSkipsLoopback: systemd-resolved's stub (127.0.0.53)
// answers only in the node's own network namespace; its upstream list
// is used instead, keeping the node's search domains.
func TestNodeResolverSkipsLoopback(t *testing.T) {
	dir := t.TempDir()
	stub := filepath.Join(dir, "resolv.conf")
	upstream := filepath.Join(dir, "upstream.conf")
	os.WriteFile(stub, []byte("# stub\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lan\n"), 0o644)
	os.WriteFile(upstream, []byte("nameserver 192.168.1.1\nnameserver ::1\n"), 0o644)
	r, err := nodeResolver(stub, upstream)
	if err != nil || strings.Join(r.nameservers, ",") != "192.168.1.1" || strings.Join(r.searches, ",") != "lan" {
		t.Fatalf("with a stub: %+v %v", r, err)
	}
	os.WriteFile(stub, []byte("nameserver 10.0.0.1\nnameserver 127.0.0.1\n"), 0o644)
	if r, err := nodeResolver(stub, upstream); err != nil || strings.Join(r.nameservers, ",") != "10.0.0.1" {
		t.Fatalf("a real server and a loopback one: %+v %v", r, err)
	}
	if r, err := nodeResolver(filepath.Join(dir, "none"), filepath.Join(dir, "none2")); err != nil || len(r.nameservers) != 0 {
		t.Fatalf("no resolv.conf at all: %+v %v", r, err)
	}
}
