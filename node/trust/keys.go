package trust

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/node/api"
)

// Gossip key rotation with no downtime ('starling keys rotate'), after
// serf's and Consul's keyring: the node that takes the command makes a
// new key and asks every live member, over mutual TLS on the peer port
// (peertls.go), to install it (accept it alongside the old one), then to
// use it (encrypt with it), then to remove the old ones. Between steps
// every node reads every other. Each node saves its keyring in
// <data-dir>/gossip.key (the key in use first).
//
// The new key never travels over gossip: a node that 'starling node
// forget' revoked keeps the old key, but its certificate is refused on
// the peer port, so after a rotation it can no longer read or write
// gossip. A member that was down during the rotation comes back with the
// old key only; when gossip refuses it (gossip.ErrKeyMismatch) it asks a
// seed for the current keys over mutual TLS (Keyring.Refresh) and joins.

// maxGossipKeys bounds a keyring: the key in use and those of a rotation
// or two in progress.
const maxGossipKeys = 4

// checkGossipKeys checks a keyring received from a peer: 1 to
// maxGossipKeys keys of 32 bytes.
func checkGossipKeys(keys [][]byte) error {
	if len(keys) == 0 || len(keys) > maxGossipKeys {
		return fmt.Errorf("%d gossip keys (want 1 to %d)", len(keys), maxGossipKeys)
	}
	for _, k := range keys {
		if len(k) != 32 {
			return fmt.Errorf("a gossip key of %d bytes (want 32)", len(k))
		}
	}
	return nil
}

// maxOpRevoked bounds api.KeyOp.Revoked.
const maxOpRevoked = 16

// ErrRevocationPending: a key op names a revocation this node does not
// hold yet (it travels by gossip; the sender retries).
var ErrRevocationPending = errors.New("a revocation this rotation depends on has not reached this node yet")

// pendingRevocation returns ErrRevocationPending when one of op's
// revoked keys is not revoked here yet.
func (k *Keyring) pendingRevocation(op api.KeyOp) error {
	if len(op.Revoked) > maxOpRevoked {
		return fmt.Errorf("revoked: %d keys (at most %d)", len(op.Revoked), maxOpRevoked)
	}
	for _, pub := range op.Revoked {
		if !k.Trust.id.IsRevoked(pub) {
			return ErrRevocationPending
		}
	}
	return nil
}

// GossipKeyID names a gossip key in output and logs: 16 hex digits of
// its SHA-256 (never the key).
func GossipKeyID(k []byte) string {
	sum := sha256.Sum256(k)
	return hex.EncodeToString(sum[:8])
}

// Keyring is this node's part in key rotations: its gossip keyring
// (gossip.Cluster's), saved in DataDir, and the calls to other nodes'
// keyrings over mutual TLS (trust). A nil *Keyring is a node running with
// --insecure (no gossip key).
type Keyring struct {
	Cluster *gossip.Cluster
	Trust   *Trust
	DataDir string
	Self    string // this node's name
	Log     *slog.Logger
	// Sealed seals the Secrets again under a new key (sealed.Resealer)
	// once every node uses it, before the old key is removed; nil: none.
	Sealed interface {
		Reseal(ctx context.Context) (int, error)
	}
	// mu serialises keyring changes with their saving; rotating allows
	// one rotation from this node at a time.
	mu       sync.Mutex
	rotating sync.Mutex
}

// errRotationRunning: a rotation from this node is under way.
var errRotationRunning = errors.New("a key rotation from this node is under way; wait for it to finish")

// apply changes this node's keyring and saves it.
func (k *Keyring) apply(op api.KeyOp) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(op.Key) != 32 {
		return fmt.Errorf("key: want 32 bytes, got %d", len(op.Key))
	}
	var err error
	switch op.Op {
	case "install":
		if len(k.Cluster.Keys()) >= maxGossipKeys && !slices.ContainsFunc(k.Cluster.Keys(), func(have []byte) bool { return bytes.Equal(have, op.Key) }) {
			return fmt.Errorf("the keyring holds %d keys already; finish or undo the rotation in progress", maxGossipKeys)
		}
		err = k.Cluster.InstallKey(op.Key)
	case "use":
		err = k.Cluster.UseKey(op.Key)
	case "remove":
		err = k.Cluster.RemoveKey(op.Key)
	default:
		return fmt.Errorf("op %q: want install, use or remove", op.Op)
	}
	if err != nil {
		return err
	}
	k.Log.Info("gossip keyring changed", "op", op.Op, "key", GossipKeyID(op.Key))
	return saveGossipKeys(k.DataDir, k.Cluster.Keys())
}

// KeyOp runs a key operation a rotating node sends (the peer port's
// POST /v1/keys, nodes only): 409 while a revocation it names has not
// arrived, 400 for an op that cannot be applied.
func (k *Keyring) KeyOp(op api.KeyOp) error {
	if err := k.pendingRevocation(op); err != nil {
		if errors.Is(err, ErrRevocationPending) {
			return api.NewError(http.StatusConflict, err)
		}
		return api.NewError(http.StatusBadRequest, err)
	}
	if err := k.apply(op); err != nil {
		return api.NewError(http.StatusBadRequest, err)
	}
	return nil
}

// Keys is this node's keyring, the key in use first (the peer port's
// GET /v1/keys, nodes only).
func (k *Keyring) Keys() [][]byte { return k.Cluster.Keys() }

// revocationWait bounds how long post retries a node that has not
// received a revocation yet (gossip spreads one in about a second).
const revocationWait = 30 * time.Second

// post sends op to node name's keyring over mutual TLS; while name
// answers that a revocation in op.Revoked has not reached it yet, it
// retries every 500 ms for up to revocationWait.
func (k *Keyring) post(ctx context.Context, name string, op api.KeyOp) error {
	deadline := time.Now().Add(revocationWait)
	for {
		err := k.postOnce(ctx, name, op)
		if !errors.Is(err, ErrRevocationPending) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// postOnce is one POST /v1/keys to node name.
func (k *Keyring) postOnce(ctx context.Context, name string, op api.KeyOp) error {
	addr, ok := PeerAddr(k.Cluster.Members(), name)
	if !ok {
		return fmt.Errorf("node %s is not a member", name)
	}
	c, err := peerClient(addr, k.Trust.ClientTLS(name))
	if err != nil {
		return err
	}
	err = c.KeyOp(ctx, op)
	if apierrors.IsConflict(err) && strings.Contains(err.Error(), ErrRevocationPending.Error()) {
		return ErrRevocationPending
	}
	return err
}

// Rotate runs a rotation from this node: install, use, remove on every
// live member (this one included). It stops at the first step that fails
// on any node, leaving every node able to read every other (the new key
// installed or in use on some, the old one still installed on all), and
// reports per node. revoked are node keys every member must hold as
// revoked before it installs the new key (api.KeyOp.Revoked).
func (k *Keyring) Rotate(ctx context.Context, revoked ...[]byte) (api.KeyRotation, error) {
	if k == nil {
		return api.KeyRotation{}, errInsecureKeys
	}
	if !k.rotating.TryLock() {
		return api.KeyRotation{}, errRotationRunning
	}
	defer k.rotating.Unlock()
	// A keyring with more than one key is a rotation that did not
	// finish (a node was unreachable): this one completes it with the
	// key in use here instead of starting another, so no node is left
	// with a key the others removed.
	var key []byte
	old := k.Cluster.Keys()
	if len(old) > 1 {
		key, old = old[0], old[1:]
	} else {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return api.KeyRotation{}, err
		}
	}
	var members, down, skipped []string
	for _, m := range k.Cluster.Members() {
		switch {
		case m.Name != k.Self && !k.Trust.isNode(m.Name):
			// A member with no certified identity (a forgotten node,
			// or a process that holds only the gossip key) gets no key
			// now and none from a peer later.
			skipped = append(skipped, m.Name)
		case !m.State.Up():
			down = append(down, m.Name)
		default:
			members = append(members, m.Name)
		}
	}
	slices.Sort(members)
	slices.Sort(down)
	slices.Sort(skipped)
	res := api.KeyRotation{Key: GossipKeyID(key), Resumed: len(k.Cluster.Keys()) > 1, Nodes: members, Down: down, Skipped: skipped}
	step := func(op string, key []byte) error {
		var failed []string
		for _, name := range members {
			var err error
			if name == k.Self {
				err = k.apply(api.KeyOp{Op: op, Key: key})
			} else {
				o := api.KeyOp{Op: op, Key: key}
				if op == "install" {
					o.Revoked = revoked
				}
				err = k.post(ctx, name, o)
			}
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", name, err))
			}
		}
		res.Steps = append(res.Steps, api.KeyStep{Op: op, Key: GossipKeyID(key), Failed: failed})
		if len(failed) > 0 {
			return fmt.Errorf("%s key %s failed on %d of %d nodes (the cluster keeps working: every node still holds the old key); run 'starling keys rotate' again once they are up: %v",
				op, GossipKeyID(key), len(failed), len(members), failed)
		}
		return nil
	}
	if err := step("install", key); err != nil {
		return res, err
	}
	if err := step("use", key); err != nil {
		return res, err
	}
	if k.Sealed != nil {
		// Secrets sealed under the old key are sealed under the new
		// one before any node removes the old key.
		if _, err := k.Sealed.Reseal(ctx); err != nil {
			return res, fmt.Errorf("seal the Secrets again under key %s (the old key is kept; run 'starling keys rotate' again): %w", GossipKeyID(key), err)
		}
	}
	for _, o := range old {
		if err := step("remove", o); err != nil {
			return res, err
		}
	}
	k.Log.Info("rotated the gossip key", "key", GossipKeyID(key), "nodes", len(members), "down", down)
	return res, nil
}

// errInsecureKeys: a node with --insecure has no gossip key.
var errInsecureKeys = errors.New("this cluster runs with --insecure: gossip has no key to rotate")

// RotateKeys runs a rotation from this node (the operator's POST
// /v1/keys/rotate): 400 with --insecure, 502 when a node failed a step.
func (k *Keyring) RotateKeys(ctx context.Context) (api.KeyRotation, error) {
	res, err := k.Rotate(ctx)
	if err != nil {
		status := http.StatusBadGateway
		if k == nil {
			status = http.StatusBadRequest
		}
		return res, api.NewError(status, err)
	}
	return res, nil
}

// Refresh asks the members at seeds (gossip addresses) for the
// cluster's current gossip keys over mutual TLS and installs them, the
// first in use; for a node that missed a rotation. It reports whether
// the keyring changed.
func (k *Keyring) Refresh(ctx context.Context, seeds []string) (bool, error) {
	var errs []error
	for _, seed := range seeds {
		host, port, err := SplitHostPort(seed, 7946)
		if err != nil {
			continue
		}
		keys, err := k.fetch(ctx, net.JoinHostPort(host, strconv.Itoa(peerPort(port))))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", seed, err))
			continue
		}
		have := k.Cluster.Keys()
		if bytes.Equal(have[0], keys[0]) {
			return false, nil
		}
		for _, key := range keys {
			if err := k.apply(api.KeyOp{Op: "install", Key: key}); err != nil {
				return false, err
			}
		}
		if err := k.apply(api.KeyOp{Op: "use", Key: keys[0]}); err != nil {
			return false, err
		}
		for _, key := range have {
			if !slices.ContainsFunc(keys, func(n []byte) bool { return bytes.Equal(n, key) }) {
				k.apply(api.KeyOp{Op: "remove", Key: key})
			}
		}
		k.Log.Info("took the cluster's current gossip keys from a seed (this node missed a key rotation)", "seed", seed, "key", GossipKeyID(keys[0]))
		return true, nil
	}
	return false, errors.Join(errs...)
}

// fetch is GET /v1/keys at addr (a peer port), over mutual TLS with any
// node of the cluster (trust.anyNodeTLS).
func (k *Keyring) fetch(ctx context.Context, addr string) ([][]byte, error) {
	c, err := peerClient(addr, k.Trust.anyNodeTLS())
	if err != nil {
		return nil, err
	}
	keys, err := c.Keys(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkGossipKeys(keys); err != nil {
		return nil, err
	}
	return keys, nil
}

// keyRefreshInterval is how often a node that sees no live peer checks
// whether the cluster moved to a gossip key it lacks.
const keyRefreshInterval = 30 * time.Second

// RefreshLoop covers a node that was running but cut off while the
// cluster rotated its key: it sees every peer dead (they cannot read it,
// nor it them). Every keyRefreshInterval in that state it asks the peers
// it knows (and targets) for the current keys (refresh) and, given new ones,
// joins again.
func (k *Keyring) RefreshLoop(ctx context.Context, targets func() []string) {
	if k == nil {
		return
	}
	Every(ctx, keyRefreshInterval, func() {
		var peers []string
		for _, m := range k.Cluster.Members() {
			if m.Name == k.Self {
				continue
			}
			if m.State.Up() {
				return // not alone: nothing to fix
			}
			peers = append(peers, net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port))))
		}
		if len(peers) == 0 {
			return
		}
		seeds := append(targets(), peers...)
		if changed, _ := k.Refresh(ctx, seeds); changed {
			if _, err := k.Cluster.Join(seeds); err != nil {
				k.Log.Warn("join after taking new gossip keys", "err", err)
			}
		}
	})
}
