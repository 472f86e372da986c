package gossip

import (
	"errors"
	"fmt"

	"github.com/hashicorp/memberlist"
)

// Key rotation, as serf and Consul do it with memberlist's keyring: every
// member first installs the new key (accepted on receipt, alongside the
// old one), then uses it (encrypts with it), then removes the old one.
// Between the steps every node can read every other, so the cluster keeps
// working. The gossip layer only changes its own keyring; distributing the
// key to the members is its caller's job (node/trust/keys.go, over mutual TLS).

// ErrNoKeyring: the cluster runs without encryption.
var ErrNoKeyring = errors.New("gossip: no keyring (gossip is not encrypted)")

// InstallKey adds key (16, 24 or 32 bytes) to the keys accepted on
// receipt. Installing a key already installed changes nothing.
func (c *Cluster) InstallKey(key []byte) error {
	return c.keyringOp("install", func(kr *memberlist.Keyring) error { return kr.AddKey(key) })
}

// UseKey makes key, which must be installed, the one messages are
// encrypted with.
func (c *Cluster) UseKey(key []byte) error {
	return c.keyringOp("use", func(kr *memberlist.Keyring) error { return kr.UseKey(key) })
}

// RemoveKey removes key from the keyring; the key in use cannot be
// removed.
func (c *Cluster) RemoveKey(key []byte) error {
	return c.keyringOp("remove", func(kr *memberlist.Keyring) error { return kr.RemoveKey(key) })
}

func (c *Cluster) keyringOp(op string, f func(*memberlist.Keyring) error) error {
	if c.keyring == nil {
		return ErrNoKeyring
	}
	if err := f(c.keyring); err != nil {
		return fmt.Errorf("gossip: %s key: %w", op, err)
	}
	return nil
}

// Keys returns the installed keys, the one in use first.
func (c *Cluster) Keys() [][]byte {
	kr := c.keyring
	if kr == nil {
		return nil
	}
	return kr.GetKeys()
}
