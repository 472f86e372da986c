package cli

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
)

// TestCheckLBPool: a pool holding a node's address or a node's pod
// subnet, or outside the LAN of the interface that holds a node's
// address, is refused with the
// node and the fix named.
func TestCheckLBPool(t *testing.T) {
	nodes := []api.Node{{Name: "n1", Address: "192.168.1.11:7946"}, {Name: "n2", Address: "192.168.1.12", PodSubnet: "10.22.1.0/24"}}
	lan := []netip.Prefix{netip.MustParsePrefix("192.168.1.11/24")}
	for _, c := range []struct {
		pool, err string
		local     []netip.Prefix
	}{
		{pool: "192.168.1.240/28", local: lan},
		{pool: "192.168.1.240/28"},
		{pool: "192.168.1.0/28", local: lan, err: "holds node n1's address 192.168.1.11"},
		{pool: "192.168.2.240/28", local: lan, err: "outside the nodes' LAN 192.168.1.0/24 (node n1)"},
		{pool: "192.168.0.0/16", local: lan, err: "holds node n1's address"},
		{pool: "10.22.0.0/16", err: "overlaps node n2's pod subnet 10.22.1.0/24"},
	} {
		err := checkLBPool(netip.MustParsePrefix(c.pool), nodes, c.local)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: %v, want %q", c.pool, err, c.err)
		}
	}
}

// TestExternalIPColumn: as kubectl shows it.
func TestExternalIPColumn(t *testing.T) {
	lb := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
	if got := externalIP(lb); got != "<pending>" {
		t.Errorf("LoadBalancer without an address: %q", got)
	}
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.168.1.240"}}
	if got := externalIP(lb); got != "192.168.1.240" {
		t.Errorf("LoadBalancer with an address: %q", got)
	}
	if got := externalIP(&corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP}}); got != "<none>" {
		t.Errorf("ClusterIP: %q", got)
	}
	raw := []byte(`{"spec":{"type":"LoadBalancer"},"status":{"loadBalancer":{"ingress":[{"ip":"192.168.1.241"}]}}}`)
	if st := serviceStatus(raw); len(st.LoadBalancer.Ingress) != 1 || st.LoadBalancer.Ingress[0].IP != "192.168.1.241" {
		t.Errorf("status from the API: %+v", st)
	}
}
