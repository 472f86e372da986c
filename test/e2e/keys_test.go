package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
)

// TestKeyRotationKeepsServingAndShutsOutForgottenNode: 'starling keys
// rotate' moves the live nodes to a new gossip key (install, use, remove)
// and the cluster keeps working. A node that was down during the rotation
// takes the new key from a peer over mutual TLS when it comes back and
// rejoins. A forgotten node, which still holds the old key on disk,
// cannot: its certificate's key is revoked, so no peer hands it the new
// key, and gossip under the old one is refused.
func TestKeyRotationKeepsServingAndShutsOutForgottenNode(t *testing.T) {
	c := newCluster(t, 3)
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	waitReadyNodes(t, n1, 3)
	// A Secret sealed under the first key: each rotation seals it again
	// under the new key before the old one is removed.
	if _, err := n1.CLI("create", "secret", "generic", "keys-db", "--from-literal", "password=rotated-7d1c"); err != nil {
		t.Fatal(err)
	}
	n3.KillAgent(syscall.SIGTERM)
	n3Keys, err := os.ReadFile(filepath.Join(n3.DataDir, "gossip.key"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() error {
		out, err := n1.CLI("node", "forget", "n3")
		if err != nil {
			return fmt.Errorf("node forget n3: %v %s", err, out)
		}
		return nil
	})
	n2.KillAgent(syscall.SIGTERM) // down during the rotation, not forgotten
	// A stop is not a leave: the rotation counts n2 down once failure
	// detection finds it dead (before that it names n2 unreachable and
	// changes nothing).
	waitFor(t, 30*time.Second, func() error {
		nodes, err := n1.API().Nodes(context.Background())
		if err != nil {
			return err
		}
		for _, m := range nodes {
			if m.Name == "n2" && m.State != "dead" {
				return fmt.Errorf("n1 holds n2 %s, want dead", m.State)
			}
		}
		return nil
	})
	read := func(dataDir string) []string {
		b, err := os.ReadFile(filepath.Join(dataDir, "gossip.key"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(string(b))
	}
	old := read(n1.DataDir)
	out, err := n1.CLI("keys", "rotate")
	if err != nil || !strings.Contains(out, "gossip key rotated") || !strings.Contains(out, "down (they take the new key from a peer when they return): n2\n") ||
		!strings.Contains(out, "skipped, no certified identity (forgotten, or not a node): n3") {
		t.Fatalf("keys rotate: %q %v", out, err)
	}
	t.Logf("keys rotate:\n%s", out)
	now := read(n1.DataDir)
	if len(now) != 1 || now[0] == old[0] {
		t.Fatalf("n1's keyring after the rotation: %d keys, new=%v", len(now), now[0] != old[0])
	}
	if strings.Contains(out, now[0]) || strings.Contains(out, old[0]) {
		t.Fatal("keys rotate printed a key")
	}

	// n2 comes back with the old key only, takes the new one and rejoins.
	if err := n2.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	waitReadyNodes(t, n1, 2)
	if got := read(n2.DataDir); len(got) != 1 || got[0] != now[0] {
		t.Fatalf("n2's keyring after it came back: %v, want the new key only", len(got))
	}
	for _, n := range []*harness.Node{n1, n2} {
		waitFor(t, 30*time.Second, func() error {
			out, err := n.CLI("get", "secret", "keys-db", "-o", "yaml", "--reveal")
			if err != nil || !strings.Contains(out, base64.StdEncoding.EncodeToString([]byte("rotated-7d1c"))) {
				return fmt.Errorf("%s: the Secret after two rotations: %q %v", n.Name, out, err)
			}
			return nil
		})
	}
	apply(t, n2, deployment("after-rotation", 2, "x"))
	waitFor(t, 30*time.Second, func() error {
		out, err := n1.CLI("get", "deployments")
		if err != nil || !strings.Contains(out, "after-rotation") {
			return fmt.Errorf("n1 has not seen n2's write: %q %v", out, err)
		}
		return nil
	})

	// n3, forgotten, still holds the old key and its old certificate.
	if err := n3.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second)
	if nodes, _ := n1.CLI("get", "nodes"); strings.Contains(nodes, "n3 ") && strings.Contains(nodes, "alive") && strings.Contains(nodes, n3.PodSubnet) {
		t.Fatalf("the forgotten node is back:\n%s", nodes)
	}
	// The forget itself rotated (to old[0]), then keys rotate (to now[0]):
	// n3 holds the key from before its forget and nothing since.
	if got := read(n3.DataDir); strings.Join(got, " ") != strings.Join(strings.Fields(string(n3Keys)), " ") || slices.Contains(got, old[0]) || slices.Contains(got, now[0]) {
		t.Fatal("the forgotten node obtained a later key")
	}
	log, _ := os.ReadFile(n3.AgentLogPath())
	if !strings.Contains(string(log), "this node was forgotten: 'starling node forget n3' revoked its key") {
		t.Fatalf("n3 did not try (and fail) to take the new key, or did not say it was forgotten:\n%s", n3.Tail(30))
	}
}
