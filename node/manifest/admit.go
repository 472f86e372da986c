package manifest

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// AdmitNew checks objects being applied against rules that came after
// objects breaking them could be stored: a stored object is still
// decoded and served as before (Decode does not apply these), a new
// one is refused. Errors name the object, the field and the fix.
//
//   - A StatefulSet's name is one DNS label (no dots), as Kubernetes
//     requires: its replicas' hostnames and DNS names
//     (NAME-ORDINAL.SERVICE.NS.svc...) are made of it.
//   - An ACME Ingress's TLS entry without hosts takes its rules' hosts:
//     a wildcard among them cannot be proven by HTTP-01, and would fail
//     the whole order.
func AdmitNew(objs []Object) error {
	var errs []error
	for _, o := range objs {
		var fe field.ErrorList
		switch {
		case o.StatefulSet != nil && strings.Contains(o.Name, "."):
			fe = append(fe, field.Invalid(field.NewPath("metadata", "name"), o.Name,
				"must be a DNS label, without dots: a StatefulSet's replicas are named NAME-ORDINAL, one label of their hostname and DNS name"))
		case o.Ingress != nil && WantsACME(o.Ingress):
			p := field.NewPath("spec")
			for i, t := range o.Ingress.Spec.TLS {
				if len(t.Hosts) > 0 {
					continue
				}
				for j, r := range o.Ingress.Spec.Rules {
					if strings.HasPrefix(r.Host, "*.") {
						fe = append(fe, field.Invalid(p.Child("rules").Index(j).Child("host"), r.Host,
							fmt.Sprintf("spec.tls[%d] has no hosts, so it would get a certificate for this wildcard, which needs a DNS-01 challenge; Starling's ACME issuer answers HTTP-01 only: list the names in spec.tls[%d].hosts", i, i)))
					}
				}
			}
		}
		if len(fe) > 0 {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", o.Kind, o.Namespace, o.Name, fe.ToAggregate()))
		}
	}
	return errors.Join(errs...)
}
