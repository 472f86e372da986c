package ingress

import (
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/view"
)

// InputOf is the table input of view v: its Ingresses, the ports and
// ready endpoints of every Service they name (as the dataplane has
// them: view.View.SvcPorts), and their certificates through certs (nil:
// none, for a table read for its routes only).
func InputOf(v *view.View, certs *Certs) Input {
	in := Input{Ports: map[string][]ServicePort{}}
	exists := map[string]bool{}
	if len(v.Ingresses) > 0 {
		for _, s := range v.Services {
			exists[s.Namespace+"/"+s.Name] = true
		}
	}
	for _, o := range v.Ingresses {
		ing := ingressOf(o.Ingress)
		in.Ingresses = append(in.Ingresses, ing)
		refs := []*BackendRef{ing.Default}
		for _, r := range ing.Rules {
			for i := range r.Paths {
				refs = append(refs, &r.Paths[i].Backend)
			}
		}
		for _, ref := range refs {
			if ref == nil || v.SvcPorts == nil {
				continue
			}
			key := o.Namespace + "/" + ref.Service
			if _, done := in.Ports[key]; done || !exists[key] {
				continue // a Service that does not exist has no entry
			}
			var ports []ServicePort
			for _, p := range v.SvcPorts.Get(key) {
				ports = append(ports, ServicePort{Name: p.Name, Port: p.Port, Endpoints: p.Endpoints})
			}
			in.Ports[key] = ports
		}
	}
	in.Challenge = func(token string) (string, bool) {
		data, _, ok := v.Config.ConfigMap(SystemNamespace, ChallengeName(token))
		if !ok || data["token"] != token {
			return "", false
		}
		return data["keyAuthorization"], true
	}
	if certs == nil {
		return in
	}
	in.Cert = func(ns, name string) (*tls.Certificate, error) {
		data, ok := v.Config.Secret(ns, name)
		if !ok {
			return nil, errors.New("no such Secret")
		}
		return certs.of(ns+"/"+name, data)
	}
	return in
}

// ingressOf is the table's reading of a decoded (validated) Ingress.
func ingressOf(in *networkingv1.Ingress) Ingress {
	ing := Ingress{Namespace: in.Namespace, Name: in.Name, Created: in.CreationTimestamp.Time, BodyBytes: manifest.DefaultBodyBytes, ACME: manifest.WantsACME(in),
		NoRedirect: in.Annotations[manifest.SSLRedirectAnnotation] == "false"}
	if v, ok := in.Annotations[manifest.BodySizeAnnotation]; ok {
		if n, err := manifest.BodyBytes(v); err == nil {
			ing.BodyBytes = n
		}
	}
	if b := in.Spec.DefaultBackend; b != nil && b.Service != nil {
		ref := refOf(b.Service)
		ing.Default = &ref
	}
	for _, r := range in.Spec.Rules {
		rule := Rule{Host: r.Host}
		if r.HTTP != nil {
			for _, p := range r.HTTP.Paths {
				if p.Backend.Service == nil {
					continue
				}
				typ := Prefix
				if p.PathType != nil && *p.PathType == networkingv1.PathTypeExact {
					typ = Exact
				}
				rule.Paths = append(rule.Paths, Path{Path: p.Path, Type: typ, Backend: refOf(p.Backend.Service)})
			}
		}
		ing.Rules = append(ing.Rules, rule)
	}
	for _, t := range in.Spec.TLS {
		ing.TLS = append(ing.TLS, TLS{Hosts: t.Hosts, Secret: t.SecretName})
	}
	return ing
}

func refOf(s *networkingv1.IngressServiceBackend) BackendRef {
	return BackendRef{Service: s.Name, Port: uint16(s.Port.Number), PortName: s.Port.Name}
}

// Certs parses TLS Secrets' key pairs once per content:
// a view that holds the same Secret reuses the parsed certificate.
// The zero value is ready; it is safe for concurrent use.
type Certs struct {
	mu   sync.Mutex
	byID map[string]certEntry // by "namespace/name"
}

type certEntry struct {
	sum  [32]byte
	cert *tls.Certificate
	err  error
}

// keep forgets the certificates of every Secret but those of used
// ("namespace/name"): a deleted Secret's key is not kept in memory.
func (c *Certs) keep(used map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.byID {
		if !used[k] {
			delete(c.byID, k)
		}
	}
}

// of is the certificate of the Secret key whose data is data: a
// kubernetes.io/tls Secret's, or any Secret's with the same two keys.
func (c *Certs) of(key string, data map[string][]byte) (*tls.Certificate, error) {
	crt, hasCrt := data[corev1.TLSCertKey]
	pem, hasKey := data[corev1.TLSPrivateKeyKey]
	if !hasCrt || !hasKey {
		return nil, errors.New("want a kubernetes.io/tls Secret with " + strconv.Quote(corev1.TLSCertKey) + " and " + strconv.Quote(corev1.TLSPrivateKeyKey))
	}
	h := sha256.New()
	h.Write(crt)
	h.Write([]byte{0})
	h.Write(pem)
	var sum [32]byte
	h.Sum(sum[:0])
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byID[key]; ok && e.sum == sum {
		return e.cert, e.err
	}
	cert, err := tls.X509KeyPair(crt, pem)
	e := certEntry{sum: sum, err: err}
	if err == nil {
		e.cert = &cert
	}
	if c.byID == nil {
		c.byID = map[string]certEntry{}
	}
	c.byID[key] = e
	return e.cert, e.err
}
