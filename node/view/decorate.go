package view

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/starling-orchestrator/starling/net/service"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// DecorateServices fills in the allocated ClusterIP and NodePorts of
// the Services in items (JSON objects), and the LAN address of a
// LoadBalancer Service (its status, as LoadBalancer ingress) or why it
// has none (api.LoadBalancerCondition), as a Kubernetes API server shows
// them.
func DecorateServices(alloc service.Allocation, items []api.Object) {
	for i, it := range items {
		o, err := manifest.Decode(it.Object)
		if err != nil || o.Service == nil {
			continue
		}
		key := o.Namespace + "/" + o.Name
		if ip, ok := alloc.ClusterIPs[key]; ok {
			o.Service.Spec.ClusterIP = ip.String()
			o.Service.Spec.ClusterIPs = []string{ip.String()}
		}
		for j, p := range o.Service.Spec.Ports {
			if np, ok := alloc.NodePorts[key+"/"+p.Name]; ok {
				o.Service.Spec.Ports[j].NodePort = np
			}
		}
		if lb, ok := alloc.LoadBalancers[key]; ok {
			o.Service.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lb.String()}}
		} else if why, ok := alloc.LBPending[key]; ok {
			o.Service.Status.Conditions = []metav1.Condition{{Type: api.LoadBalancerCondition, Status: metav1.ConditionFalse, Reason: "Pending", Message: why}}
		}
		if b, err := manifest.Encode(o); err == nil {
			items[i].Object = b
		}
	}
}
