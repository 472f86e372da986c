package manifest

import (
	"fmt"
	"strconv"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// KindIngress is the kind of networking.k8s.io/v1 Ingresses: HTTP(S)
// routes by host and path to Services, served by the proxy every node
// runs (node/ingress).
const KindIngress = "Ingress"

// Annotations an Ingress may carry, read as ingress-nginx reads them so
// that charts written for it keep their meaning.
const (
	// BodySizeAnnotation bounds a request's body ("8m", "100k", a
	// quantity; "0": no bound). The default is DefaultBodyBytes.
	BodySizeAnnotation = "nginx.ingress.kubernetes.io/proxy-body-size"
	// SSLRedirectAnnotation "false" serves a TLS host over plain HTTP
	// too, instead of redirecting to HTTPS.
	SSLRedirectAnnotation = "nginx.ingress.kubernetes.io/ssl-redirect"
)

// ACMEAnnotation "true" has the cluster's ACME server (Let's Encrypt by
// default) issue the certificates of the Ingress's spec.tls entries,
// as cert-manager's ingress-shim does for it; cert-manager's issuer
// annotations (CertManagerIssuerAnnotations) ask the same, so charts
// written for cert-manager get certificates without it.
const ACMEAnnotation = "kubernetes.io/tls-acme"

// CertManagerIssuerAnnotations are cert-manager's ways to ask for an
// Ingress's certificates: any value asks Starling's ACME issuer.
var CertManagerIssuerAnnotations = []string{"cert-manager.io/cluster-issuer", "cert-manager.io/issuer"}

// WantsACME reports whether Ingress in asks for ACME certificates.
func WantsACME(in *networkingv1.Ingress) bool {
	if in.Annotations[ACMEAnnotation] == "true" {
		return true
	}
	for _, k := range CertManagerIssuerAnnotations {
		if in.Annotations[k] != "" {
			return true
		}
	}
	return false
}

// BackendsAnnotation is served on an Ingress, never stored: each
// backend ("service:port") with its ready endpoints, as the node that
// answered routes to them (JSON).
const BackendsAnnotation = "starling.dev/backends"

// CertificatesAnnotation is served on an Ingress, never stored: what
// each TLS Secret it names holds (names, issuer, end), as the node that
// answered reads it (JSON).
const CertificatesAnnotation = "starling.dev/certificates"

// DefaultBodyBytes is the request body bound of an Ingress without
// BodySizeAnnotation: ingress-nginx's default (proxy-body-size 1m).
const DefaultBodyBytes = 1 << 20

var ingressFields = newFieldTree(commonFields, serverOwnedMeta, []string{
	"spec.ingressClassName",
	"spec.defaultBackend.service.name", "spec.defaultBackend.service.port.number", "spec.defaultBackend.service.port.name",
	"spec.tls[].hosts", "spec.tls[].secretName",
	"spec.rules[].host",
	"spec.rules[].http.paths[].path", "spec.rules[].http.paths[].pathType",
	"spec.rules[].http.paths[].backend.service.name",
	"spec.rules[].http.paths[].backend.service.port.number",
	"spec.rules[].http.paths[].backend.service.port.name",
	// Refused by validateIngressBackend with the reason; listed so that
	// the refusal is said once.
	"spec.defaultBackend.resource.apiGroup", "spec.defaultBackend.resource.kind", "spec.defaultBackend.resource.name",
	"spec.rules[].http.paths[].backend.resource.apiGroup", "spec.rules[].http.paths[].backend.resource.kind",
	"spec.rules[].http.paths[].backend.resource.name",
})

// regexChars are characters of regular expressions that a literal URL
// path rarely holds: a path with one was most likely written for
// ingress-nginx's use-regex, which Starling does not do.
const regexChars = "()[]{}*+?^$|\\"

// unsupportedNginx are the ingress-nginx annotations Starling's proxy
// refuses, with why.
var unsupportedNginx = map[string]string{
	"nginx.ingress.kubernetes.io/rewrite-target":   "path rewriting is not supported: serve the app under the Ingress's path (most apps take a base path setting)",
	"nginx.ingress.kubernetes.io/use-regex":        "regular-expression paths are not supported: use Prefix or Exact paths",
	"nginx.ingress.kubernetes.io/backend-protocol": "backends are spoken to over HTTP/1.1 only: terminate TLS at the Ingress and serve HTTP in the pod",
}

var pathTypes = []networkingv1.PathType{networkingv1.PathTypeExact, networkingv1.PathTypePrefix, networkingv1.PathTypeImplementationSpecific}

// fromIngress clears server-owned fields of i and wraps it. The API
// server sets no defaults on an Ingress's spec.
func fromIngress(i *networkingv1.Ingress) Object {
	i.APIVersion, i.Kind = "networking.k8s.io/v1", KindIngress
	clearMeta(&i.ObjectMeta)
	i.Status = networkingv1.IngressStatus{}
	delete(i.Annotations, BackendsAnnotation)
	delete(i.Annotations, CertificatesAnnotation)
	if len(i.Annotations) == 0 {
		i.Annotations = nil
	}
	return Object{Kind: KindIngress, Namespace: i.Namespace, Name: i.Name, Ingress: i}
}

// validateIngress follows Kubernetes' ValidateIngress for what the
// proxy serves: Service backends (not resource backends), hosts that
// are DNS names or a leading "*." wildcard, absolute paths with a path
// type, TLS entries naming a Secret.
func validateIngress(in *networkingv1.Ingress) field.ErrorList {
	errs := validateMeta(&in.ObjectMeta, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))
	s, p := &in.Spec, field.NewPath("spec")
	if c := s.IngressClassName; c != nil {
		for _, msg := range validation.IsDNS1123Subdomain(*c) {
			errs = append(errs, field.Invalid(p.Child("ingressClassName"), *c, msg))
		}
	}
	if s.DefaultBackend == nil && len(s.Rules) == 0 {
		errs = append(errs, field.Required(p.Child("rules"), "either `defaultBackend` or `rules` must be specified"))
	}
	if s.DefaultBackend != nil {
		errs = append(errs, validateIngressBackend(s.DefaultBackend, p.Child("defaultBackend"))...)
	}
	for i, t := range s.TLS {
		tp := p.Child("tls").Index(i)
		for j, h := range t.Hosts {
			errs = append(errs, validateIngressHost(h, tp.Child("hosts").Index(j))...)
		}
		if t.SecretName == "" {
			errs = append(errs, field.Required(tp.Child("secretName"), "the name of a kubernetes.io/tls Secret in the Ingress's namespace"))
		}
		for _, msg := range validation.IsDNS1123Subdomain(t.SecretName) {
			if t.SecretName != "" {
				errs = append(errs, field.Invalid(tp.Child("secretName"), t.SecretName, msg))
			}
		}
	}
	for i, r := range s.Rules {
		rp := p.Child("rules").Index(i)
		if r.Host != "" {
			errs = append(errs, validateIngressHost(r.Host, rp.Child("host"))...)
		}
		if r.HTTP == nil {
			errs = append(errs, field.Required(rp.Child("http"), "the paths this host serves (`http.paths`)"))
			continue
		}
		if len(r.HTTP.Paths) == 0 {
			errs = append(errs, field.Required(rp.Child("http", "paths"), "at least one path, e.g. {path: /, pathType: Prefix, backend: ...}"))
		}
		for j, hp := range r.HTTP.Paths {
			pp := rp.Child("http", "paths").Index(j)
			switch {
			case hp.PathType == nil:
				errs = append(errs, field.Required(pp.Child("pathType"), "Prefix, Exact or ImplementationSpecific"))
			case !containsPathType(*hp.PathType):
				errs = append(errs, field.NotSupported(pp.Child("pathType"), *hp.PathType, pathTypes))
			}
			if !strings.HasPrefix(hp.Path, "/") {
				errs = append(errs, field.Invalid(pp.Child("path"), hp.Path, "must be an absolute path (start with '/')"))
			}
			// Kubernetes' invalidPathSequences and invalidPathSuffixes:
			// a path the proxy would never see (it refuses such requests).
			for _, bad := range []string{"//", "/./", "/../", "%2f", "%2F"} {
				if strings.Contains(hp.Path, bad) {
					errs = append(errs, field.Invalid(pp.Child("path"), hp.Path, fmt.Sprintf("must not contain '%s'", bad)))
				}
			}
			if i := strings.IndexAny(hp.Path, regexChars); i >= 0 {
				errs = append(errs, field.Invalid(pp.Child("path"), hp.Path, fmt.Sprintf("%q looks like a regular expression: paths match literally (Prefix or Exact); write the prefix, e.g. /api", hp.Path[i:i+1])))
			}
			for _, bad := range []string{"/..", "/."} {
				if strings.HasSuffix(hp.Path, bad) {
					errs = append(errs, field.Invalid(pp.Child("path"), hp.Path, fmt.Sprintf("must not end with '%s'", bad)))
				}
			}
			errs = append(errs, validateIngressBackend(&hp.Backend, pp.Child("backend"))...)
		}
	}
	if v, ok := in.Annotations[BodySizeAnnotation]; ok {
		if _, err := BodyBytes(v); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "annotations").Key(BodySizeAnnotation), v, err.Error()))
		}
	}
	// ingress-nginx annotations that change where a request goes or how
	// it is sent: silently ignored, they would misroute. Refused, with
	// what to do instead.
	for k, why := range unsupportedNginx {
		if v, ok := in.Annotations[k]; ok && !(k == "nginx.ingress.kubernetes.io/use-regex" && v == "false") &&
			!(k == "nginx.ingress.kubernetes.io/backend-protocol" && strings.EqualFold(v, "HTTP")) {
			errs = append(errs, field.Forbidden(field.NewPath("metadata", "annotations").Key(k), why))
		}
	}
	if v, ok := in.Annotations[ACMEAnnotation]; ok && v != "true" && v != "false" {
		errs = append(errs, field.NotSupported(field.NewPath("metadata", "annotations").Key(ACMEAnnotation), v, []string{"true", "false"}))
	}
	if WantsACME(in) {
		for i, t := range in.Spec.TLS {
			if len(t.Hosts) == 0 && len(in.Spec.Rules) == 0 {
				errs = append(errs, field.Required(p.Child("tls").Index(i).Child("hosts"), "the names to get a certificate for (ACME issues certificates for names)"))
			}
			for j, h := range t.Hosts {
				if strings.HasPrefix(h, "*.") {
					errs = append(errs, field.Invalid(p.Child("tls").Index(i).Child("hosts").Index(j), h, "a wildcard needs a DNS-01 challenge; Starling's ACME issuer answers HTTP-01 only: name the hosts"))
				}
			}
		}
	}
	if v, ok := in.Annotations[SSLRedirectAnnotation]; ok && v != "true" && v != "false" {
		errs = append(errs, field.NotSupported(field.NewPath("metadata", "annotations").Key(SSLRedirectAnnotation), v, []string{"true", "false"}))
	}
	return append(errs, unsupportedFields(ingressFields, in)...)
}

func containsPathType(t networkingv1.PathType) bool {
	for _, pt := range pathTypes {
		if pt == t {
			return true
		}
	}
	return false
}

// validateIngressBackend checks a backend names a Service and one of
// its ports, by number or by name.
func validateIngressBackend(b *networkingv1.IngressBackend, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if b.Resource != nil {
		return append(errs, field.Forbidden(p.Child("resource"), "resource backends are not supported: name a Service (`service.name`, `service.port`)"))
	}
	if b.Service == nil {
		return append(errs, field.Required(p.Child("service"), "a Service: {name: NAME, port: {number: 80}}"))
	}
	sp := p.Child("service")
	if b.Service.Name == "" {
		errs = append(errs, field.Required(sp.Child("name"), "the name of a Service in the Ingress's namespace"))
	}
	for _, msg := range validation.IsDNS1035Label(b.Service.Name) {
		if b.Service.Name != "" {
			errs = append(errs, field.Invalid(sp.Child("name"), b.Service.Name, msg))
		}
	}
	port := b.Service.Port
	switch {
	case port.Name != "" && port.Number != 0:
		errs = append(errs, field.Invalid(sp.Child("port"), port, "set `name` or `number`, not both"))
	case port.Name != "":
		for _, msg := range validation.IsValidPortName(port.Name) {
			errs = append(errs, field.Invalid(sp.Child("port", "name"), port.Name, msg))
		}
	case port.Number < 1 || port.Number > 65535:
		errs = append(errs, field.Invalid(sp.Child("port", "number"), port.Number, "a Service port, 1 to 65535"))
	}
	return errs
}

// validateIngressHost checks an Ingress host: a DNS name, or a
// wildcard "*." and a DNS name; never an IP address.
func validateIngressHost(h string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if strings.Contains(h, "*") {
		for _, msg := range validation.IsWildcardDNS1123Subdomain(h) {
			errs = append(errs, field.Invalid(p, h, msg))
		}
		return errs
	}
	for _, msg := range validation.IsDNS1123Subdomain(h) {
		errs = append(errs, field.Invalid(p, h, msg))
	}
	if len(validation.IsValidIP(p, h)) == 0 {
		errs = append(errs, field.Invalid(p, h, "must be a DNS name, not an IP address"))
	}
	return errs
}

// BodyBytes parses a proxy-body-size value as ingress-nginx does
// ("1m" = 1 MiB, "512k", "1g", a bare number of bytes, or a Kubernetes
// quantity such as "10Mi"): the bound in bytes, 0 for none.
func BodyBytes(v string) (int64, error) {
	s := strings.TrimSpace(v)
	mult := int64(1)
	switch {
	case s == "":
		return 0, fmt.Errorf("want a size such as 8m, 512k or 0 (no bound)")
	case strings.HasSuffix(s, "k") || strings.HasSuffix(s, "K"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "m") || strings.HasSuffix(s, "M"):
		mult, s = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(s, "g") || strings.HasSuffix(s, "G"):
		mult, s = 1<<30, s[:len(s)-1]
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 && n <= 1<<40/mult {
		return n * mult, nil
	}
	if q, err := resource.ParseQuantity(v); err == nil && q.Sign() >= 0 && q.Value() <= 1<<40 {
		return q.Value(), nil
	}
	return 0, fmt.Errorf("want a size such as 8m, 512k, 10Mi or 0 (no bound), at most 1 TiB")
}
