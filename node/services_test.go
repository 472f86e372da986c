package node

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/test/harness"
)

// The variables enableServiceLinks gives, as the kubelet names them
// (pkg/kubelet/envvars TestFromServices): only Services of the
// container's namespace, named ports, and the
// Docker link variables for every port.
func TestServiceLinksAreTheKubeletsVariables(t *testing.T) {
	metrics := namedPort("metrics", 9121, "")
	metrics.Protocol = corev1.ProtocolUDP
	objs := []manifest.Object{
		testService(t, harness.App{Name: "redis", Namespace: "shop"}, "redis-primary", []corev1.ServicePort{namedPort("redis", 6379, ""), metrics}),
		testService(t, harness.App{Name: "web", Namespace: "other"}, "web", []corev1.ServicePort{harness.ServicePort(80, "")}),
	}
	alloc := service.Allocation{ClusterIPs: map[string]netip.Addr{
		"shop/redis-primary": netip.MustParseAddr("10.96.0.7"),
		"other/web":          netip.MustParseAddr("10.96.0.9"),
	}}
	var got []string
	for _, e := range serviceLinks(objs, alloc, "shop") {
		got = append(got, e.Name+"="+e.Value)
	}
	want := []string{
		"REDIS_PRIMARY_SERVICE_HOST=10.96.0.7",
		"REDIS_PRIMARY_SERVICE_PORT=6379",
		"REDIS_PRIMARY_SERVICE_PORT_REDIS=6379",
		"REDIS_PRIMARY_SERVICE_PORT_METRICS=9121",
		"REDIS_PRIMARY_PORT=tcp://10.96.0.7:6379",
		"REDIS_PRIMARY_PORT_6379_TCP=tcp://10.96.0.7:6379",
		"REDIS_PRIMARY_PORT_6379_TCP_PROTO=tcp",
		"REDIS_PRIMARY_PORT_6379_TCP_PORT=6379",
		"REDIS_PRIMARY_PORT_6379_TCP_ADDR=10.96.0.7",
		"REDIS_PRIMARY_PORT_9121_UDP=udp://10.96.0.7:9121",
		"REDIS_PRIMARY_PORT_9121_UDP_PROTO=udp",
		"REDIS_PRIMARY_PORT_9121_UDP_PORT=9121",
		"REDIS_PRIMARY_PORT_9121_UDP_ADDR=10.96.0.7",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("serviceLinks:\n got %q\nwant %q", got, want)
	}
	if got := serviceLinks(objs, alloc, "empty"); len(got) != 0 {
		t.Fatalf("namespace without Services got %v", got)
	}
}
