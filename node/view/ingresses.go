package view

import "github.com/starling-orchestrator/starling/node/manifest"

// ingressesInto sets v.Ingresses: prev's when no Ingress record changed,
// else decoded again (DecodeObjects: only the changed records). An
// Ingress changes no placement and no Service port, so its records are
// a change of their own (Changes.Ingresses).
func (vs *Builder) ingressesInto(v, prev *View) error {
	if !v.Changes.Ingresses && prev != nil {
		v.Ingresses = prev.Ingresses
		return nil
	}
	recs, err := vs.cfg.Records.List(KindPrefix(manifest.KindIngress))
	if err != nil {
		return err
	}
	v.Ingresses = vs.DecodeObjects(recs, map[string]bool{})
	return nil
}
