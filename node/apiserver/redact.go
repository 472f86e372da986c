package apiserver

import (
	"encoding/json"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// revealParam is the query parameter (?reveal=true) under which a get
// of one Secret answers its values; without it, and in every list, the
// answer holds each value's size only (api.Object.DataSizes).
const revealParam = "reveal"

// Redact returns items, objects of kind, with a Secret's data taken out
// and its sizes in DataSizes. A Secret that does not decode is answered
// with no object at all: its values must not leak through an error
// either.
func Redact(kind string, items []api.Object) []api.Object {
	if kind != manifest.KindSecret {
		return items
	}
	out := make([]api.Object, len(items))
	for i, it := range items {
		out[i] = it
		out[i].Object = nil
		o, err := manifest.Decode(it.Object)
		if err != nil || o.Secret == nil {
			continue
		}
		out[i].DataSizes = manifest.DataSizes(o)
		s := *o.Secret
		s.Data = nil
		if b, err := json.Marshal(&s); err == nil {
			out[i].Object = b
		}
	}
	return out
}
