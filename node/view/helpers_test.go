package view

import (
	"testing"

	"github.com/starling-orchestrator/starling/node/manifest"
)

// mustParse parses one object from YAML y, failing t on an error.
func mustParse(t testing.TB, y string) manifest.Object {
	objs, err := manifest.Parse([]byte(y), "test")
	if err != nil || len(objs) != 1 {
		t.Fatalf("parse: %v", err)
	}
	return objs[0]
}
