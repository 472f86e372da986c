package ingress

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/view"
)

// Decorate fills in what view v knows of Ingresses items as the API
// serves them: status.loadBalancer.ingress lists the live nodes'
// addresses (every node serves every Ingress), and the
// manifest.BackendsAnnotation gives each backend's ready endpoints as
// this node routes to them (`describe ingress` prints them).
func Decorate(v *view.View, items []api.Object) {
	var addrs []networkingv1.IngressLoadBalancerIngress
	for name, st := range v.Statuses {
		if ip := st.HostIP(); v.Alive[name] && ip != "" {
			addrs = append(addrs, networkingv1.IngressLoadBalancerIngress{IP: ip})
		}
	}
	slices.SortFunc(addrs, func(a, b networkingv1.IngressLoadBalancerIngress) int { return strings.Compare(a.IP, b.IP) })
	t := Build(InputOf(v, nil))
	for i, it := range items {
		o, err := manifest.Decode(it.Object)
		if err != nil || o.Ingress == nil {
			continue
		}
		key := o.Namespace + "/" + o.Name
		backends := map[string][]string{}
		for _, r := range t.Routes() {
			if r.Ingress != key {
				continue
			}
			name := fmt.Sprintf("%s:%s", strings.TrimPrefix(r.Backend.Service, o.Namespace+"/"), r.Backend.Port)
			eps := []string{}
			for _, ep := range r.Backend.Endpoints {
				eps = append(eps, ep.String())
			}
			switch {
			case !r.Backend.ServiceFound:
				eps = []string{"<no such Service>"}
			case !r.Backend.Found:
				eps = []string{"<the Service has no such port>"}
			}
			backends[name] = eps
		}
		in := o.Ingress
		in.Status.LoadBalancer.Ingress = addrs
		if in.Annotations == nil {
			in.Annotations = map[string]string{}
		}
		if b, err := json.Marshal(backends); err == nil {
			in.Annotations[manifest.BackendsAnnotation] = string(b)
		}
		certs := map[string]string{}
		for _, e := range in.Spec.TLS {
			data, _ := v.Config.Secret(in.Namespace, e.SecretName)
			certs[e.SecretName] = certificateLine(data, time.Now())
		}
		if b, err := json.Marshal(certs); err == nil && len(certs) > 0 {
			in.Annotations[manifest.CertificatesAnnotation] = string(b)
		}
		if b, err := manifest.Encode(o); err == nil {
			items[i].Object = b
		}
	}
}

// certificateLine says what a TLS Secret's data holds: its names, its
// issuer and when it ends, or why there is no certificate.
func certificateLine(data map[string][]byte, now time.Time) string {
	if data == nil {
		return "<no such Secret>"
	}
	block, _ := pem.Decode(data["tls.crt"])
	if block == nil {
		return "<no certificate in tls.crt>"
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "<tls.crt does not parse>"
	}
	return fmt.Sprintf("%s, issued by %q, ends %s (in %s)", strings.Join(leaf.DNSNames, ","), leaf.Issuer.CommonName,
		leaf.NotAfter.UTC().Format(time.RFC3339), leaf.NotAfter.Sub(now).Round(time.Hour))
}
