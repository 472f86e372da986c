package cli

import (
	"strings"
	"testing"

	"github.com/starling-orchestrator/starling/node/api"
)

// TestGetNodesShowsInsecureNodes: a node running with --insecure says so
// in its STATE column.
func TestGetNodesShowsInsecureNodes(t *testing.T) {
	var b strings.Builder
	err := printNodes(&b, getOpts{}, []api.Node{{Name: "n1", State: "alive"}, {Name: "n2", State: "alive", Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if !strings.Contains(lines[1], "alive ") || strings.Contains(lines[1], "insecure") || !strings.Contains(lines[2], "alive,insecure") {
		t.Fatalf("get nodes:\n%s", b.String())
	}
}
