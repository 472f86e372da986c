package gossip

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// TestKeyRotationKeepsMembersTalking: two members on key A; B is
// installed on both, then used by one (it sends with B, the other still
// with A, and each reads the other), then by both, and A is removed; a
// member that holds only A can no longer join, and the key in use cannot
// be removed.
func TestKeyRotationKeepsMembersTalking(t *testing.T) {
	a, b := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	tc := newTCluster(t, 2, func(_ int, cfg *Config) { cfg.SecretKey = a })
	tc.joinAll()
	n1, n2 := tc.nodes[0], tc.nodes[1]
	for _, n := range tc.nodes {
		if err := n.c.InstallKey(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := n1.c.UseKey(b); err != nil {
		t.Fatal(err)
	}
	n1.publish(t, "k/default/one", "sent with B")
	n2.publish(t, "k/default/two", "sent with A")
	tc.waitConverged(10 * time.Second)
	if err := n2.c.UseKey(b); err != nil {
		t.Fatal(err)
	}
	for _, n := range tc.nodes {
		if err := n.c.RemoveKey(a); err != nil {
			t.Fatal(err)
		}
		if keys := n.c.Keys(); len(keys) != 1 || !bytes.Equal(keys[0], b) {
			t.Fatalf("%s keyring after the rotation: %d keys", n.name, len(keys))
		}
	}
	if err := n1.c.RemoveKey(b); err == nil {
		t.Fatal("removed the key in use")
	}
	n2.publish(t, "k/default/three", "after the rotation")
	tc.waitConverged(10 * time.Second)
	old := tc.add(func(_ int, cfg *Config) { cfg.SecretKey = a }, nil)
	if _, err := old.c.Join([]string{n1.tr.Addr()}); !errors.Is(err, ErrKeyMismatch) {
		t.Fatalf("a member with the removed key joined: %v", err)
	}
}
