package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"

	"github.com/starling-orchestrator/starling/gossip/crdt"
)

// Image records say which content an image name stands for in the
// cluster: the node that imported it through the API (an operator's act)
// publishes, signed, "image/cluster/<id>" = {name, digest}. A node that
// lacks the image asks its peers for that digest and takes only that
// manifest, under that one name (runtime.fetchFromPeers): a peer cannot
// serve other content under the name, add names, or retag images.

// imageKind is the store kind of image records.
const imageKind = "image"

// imageRecord is the value of an image record.
type imageRecord struct {
	// Name is the image reference as containerd stores it
	// ("docker.io/library/nginx:1.27", "starling.local/echo:v1").
	Name string `json:"name"`
	// Digest is the digest of the image's manifest or index, "sha256:...".
	Digest string `json:"digest"`
}

// imageKey is the record key of image name: its SHA-256 in hex (a name
// holds '/' and ':', which keys cannot), 40 digits.
func imageKey(name string) string {
	sum := sha256.Sum256([]byte(name))
	return imageKind + "/cluster/" + hex.EncodeToString(sum[:20])
}

// checkImage checks an image record's value against its key.
func checkImage(key string, value []byte) *rejection {
	var ir imageRecord
	if err := json.Unmarshal(value, &ir); err != nil {
		return reject(rejectMalformed, "%s: %v", key, err)
	}
	if len(ir.Name) > 512 || checkText(ir.Name, 512) != nil {
		return reject(rejectText, "%s: image name of %d bytes", key, len(ir.Name))
	}
	if _, err := reference.ParseNamed(ir.Name); err != nil {
		return reject(rejectName, "%s: image name %q: %v", key, ir.Name, err)
	}
	if _, err := digest.Parse(ir.Digest); err != nil {
		return reject(rejectObject, "%s: digest %q: %v", key, ir.Digest, err)
	}
	if imageKey(ir.Name) != key {
		return reject(rejectKey, "record %q holds image %s", key, ir.Name)
	}
	return nil
}

// publishImages records the digests of images just imported through the
// API on this node.
func (a *Agent) publishImages(ctx context.Context, names []string) error {
	var recs []crdt.Record
	for _, n := range names {
		d, err := a.rt.ImageDigest(ctx, n)
		if err != nil {
			return fmt.Errorf("digest of %s: %w", n, err)
		}
		b, err := json.Marshal(imageRecord{Name: n, Digest: d})
		if err != nil {
			return err
		}
		key := imageKey(n)
		if old, ok, err := a.store.Get(key); err == nil && ok {
			if !old.Deleted && string(old.Value) == string(b) {
				continue
			}
			a.clock.Update(old.Version)
		}
		recs = append(recs, crdt.Record{Key: key, Value: b, Version: a.clock.Now(), Origin: a.cfg.Name})
	}
	return a.publish(recs...)
}

// recordedDigest returns the digest the cluster recorded for image name.
func (a *Agent) recordedDigest(name string) (string, bool) {
	rec, ok, err := a.store.Get(imageKey(name))
	if err != nil || !ok || rec.Deleted {
		return "", false
	}
	var ir imageRecord
	if json.Unmarshal(rec.Value, &ir) != nil || ir.Name != name {
		return "", false
	}
	return ir.Digest, true
}
