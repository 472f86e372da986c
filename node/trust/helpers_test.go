package trust

import (
	"crypto/ed25519"
	"crypto/sha256"
)

// keyOf is a fixed node key for tests, from the name.
func keyOf(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("test key " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}
