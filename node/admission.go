package node

import (
	"errors"
	"slices"

	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/view"
)

// admit checks what validating each object alone cannot, before anything
// is stored, for the Services of objs: a requested ClusterIP (inside
// --service-cidr, not the range's first or last address, not held by
// another Service) and NodePorts (not held by another Service). Objects
// of the batch are checked against each other too. Errors name the
// object and the field, as kubectl's do, and list every problem; and a
// LoadBalancer pool over the service or pod CIDR; and what
// manifest.AdmitNew refuses of objects applied (not of stored ones). (The
// size of each object is checked on its encoding, in objects.write.)
func (o *objects) admit(objs []manifest.Object) error {
	var errs []error
	if slices.ContainsFunc(objs, func(o manifest.Object) bool { return o.Service != nil }) {
		recs, err := o.st.List(view.KindPrefix(manifest.KindService))
		if err != nil {
			return err
		}
		stored, _ := view.LiveObjects(recs)
		if err := view.AdmitServices(objs, stored, o.serviceCIDR); err != nil {
			errs = append(errs, err)
		}
	}
	if err := o.views.AdmitLBPool(objs); err != nil {
		errs = append(errs, err)
	}
	if err := manifest.AdmitNew(objs); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
