package view

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/api"
)

// TestAServiceIsServedWithItsAddressesOrWhyItHasNone: the ClusterIP,
// NodePort and LoadBalancer address as allocated; a LoadBalancer
// Service without one says why in its status's condition.
func TestAServiceIsServedWithItsAddressesOrWhyItHasNone(t *testing.T) {
	svc := func(name string) api.Object {
		return api.Object{Object: []byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"` + name + `","namespace":"default"},` +
			`"spec":{"type":"LoadBalancer","selector":{"app":"a"},"ports":[{"name":"http","port":80}]}}`)}
	}
	items := []api.Object{svc("got"), svc("none")}
	alloc := service.Allocation{
		ClusterIPs:    map[string]netip.Addr{"default/got": netip.MustParseAddr("10.23.0.5"), "default/none": netip.MustParseAddr("10.23.0.6")},
		NodePorts:     map[string]int32{"default/got/http": 31000},
		LoadBalancers: map[string]netip.Addr{"default/got": netip.MustParseAddr("192.168.1.241")},
		LBPending:     map[string]string{"default/none": "loadBalancerIP 1.1.1.1 is outside the pool 192.168.1.240/28"},
	}
	DecorateServices(alloc, items)
	got, none := string(items[0].Object), string(items[1].Object)
	for _, want := range []string{`"clusterIP":"10.23.0.5"`, `"nodePort":31000`, `"ingress":[{"ip":"192.168.1.241"}]`} {
		if !strings.Contains(got, want) {
			t.Errorf("served %s, want %s in it", got, want)
		}
	}
	if !strings.Contains(none, `"type":"LoadBalancerAddress","status":"False"`) || !strings.Contains(none, "outside the pool") {
		t.Errorf("a pending LoadBalancer served as %s, want why", none)
	}
}
