package dns

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNodeResolverSkipsLoopback: systemd-resolved's stub (127.0.0.53)
// answers only in the node's own network namespace; its upstream list
// is used instead, keeping the node's search domains.
func TestNodeResolverSkipsLoopback(t *testing.T) {
	dir := t.TempDir()
	stub := filepath.Join(dir, "resolv.conf")
	upstream := filepath.Join(dir, "upstream.conf")
	os.WriteFile(stub, []byte("# stub\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lan\n"), 0o644)
	os.WriteFile(upstream, []byte("nameserver 192.168.1.1\nnameserver ::1\n"), 0o644)
	r, err := HostResolver(stub, upstream)
	if err != nil || strings.Join(r.Nameservers, ",") != "192.168.1.1" || strings.Join(r.Searches, ",") != "lan" {
		t.Fatalf("with a stub: %+v %v", r, err)
	}
	os.WriteFile(stub, []byte("nameserver 10.0.0.1\nnameserver 127.0.0.1\n"), 0o644)
	if r, err := HostResolver(stub, upstream); err != nil || strings.Join(r.Nameservers, ",") != "10.0.0.1" {
		t.Fatalf("a real server and a loopback one: %+v %v", r, err)
	}
	if r, err := HostResolver(filepath.Join(dir, "none"), filepath.Join(dir, "none2")); err != nil || len(r.Nameservers) != 0 {
		t.Fatalf("no resolv.conf at all: %+v %v", r, err)
	}
}
