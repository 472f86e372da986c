package node

import (
	"testing"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// TestAPodsContainersFitWhatPeersAccept: manifest validation bounds a
// pod's containers at what a node's record may list for one replica,
// so no accepted manifest makes peers refuse the record.
func TestAPodsContainersFitWhatPeersAccept(t *testing.T) {
	if manifest.MaxContainers > api.MaxContainers {
		t.Errorf("a pod may have %d containers, a node may report %d", manifest.MaxContainers, api.MaxContainers)
	}
}
