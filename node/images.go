package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"

	"github.com/starling-orchestrator/starling/gossip"
	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/gossip/hlc"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/apiserver"
	"github.com/starling-orchestrator/starling/node/runtime"
	"github.com/starling-orchestrator/starling/node/view"
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
	if len(ir.Name) > 512 || api.CheckText(ir.Name, 512) != nil {
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

// images is this node's image store as the API and the runtime see it:
// imports through the API (each name's digest recorded for the cluster),
// blobs served to peers, and the peers to pull an image from. It
// implements apiserver.Images.
type images struct {
	self     string
	maxBytes int64 // --max-image-size
	rt       Runtime
	store    Store
	clock    *hlc.Clock
	views    *view.Builder
	cluster  *gossip.Cluster
	peers    *peers
	writer   *writer
	// wake asks the replicas' loop for a pass after an import, which
	// retries the actions that failed for want of the image.
	wake *wake
	log  *slog.Logger
}

var _ apiserver.Images = (*images)(nil)

// publishImages records the digests of images just imported through the
// API on this node.
func (im *images) publishImages(ctx context.Context, names []string) error {
	var recs []crdt.Record
	for _, n := range names {
		d, err := im.rt.ImageDigest(ctx, n)
		if err != nil {
			return fmt.Errorf("digest of %s: %w", n, err)
		}
		b, err := json.Marshal(imageRecord{Name: n, Digest: d})
		if err != nil {
			return err
		}
		key := imageKey(n)
		if old, ok, err := im.store.Get(key); err == nil && ok {
			if !old.Deleted && string(old.Value) == string(b) {
				continue
			}
			im.clock.Update(old.Version)
		}
		recs = append(recs, crdt.Record{Key: key, Value: b, Version: im.clock.Now(), Origin: im.self})
	}
	return im.writer.PublishDurable(recs...)
}

// recordedDigest returns the digest the cluster recorded for image name.
func recordedDigest(st Store, name string) (string, bool) {
	rec, ok, err := st.Get(imageKey(name))
	if err != nil || !ok || rec.Deleted {
		return "", false
	}
	var ir imageRecord
	if json.Unmarshal(rec.Value, &ir) != nil || ir.Name != name {
		return "", false
	}
	return ir.Digest, true
}

// Import loads an image tarball into containerd and records the digest
// of every name it held for the cluster. A tarball containerd refuses is
// the caller's fault (the error is passed on, for a 400).
func (im *images) Import(ctx context.Context, tarball io.Reader) ([]api.Image, error) {
	names, err := im.rt.ImportImages(ctx, tarball)
	if err != nil {
		return nil, err
	}
	if err := im.publishImages(ctx, names); err != nil {
		return nil, api.Errorf(http.StatusInternalServerError, "image import: imported %s but could not record their digests for the cluster: %v", strings.Join(names, ", "), err)
	}
	im.wake.imageImported()
	out := []api.Image{}
	for _, n := range names {
		out = append(out, api.Image{Name: n})
	}
	return out, nil
}

// List lists this node's images.
func (im *images) List(ctx context.Context) ([]api.Image, error) { return im.rt.Images(ctx) }

// WriteBlob writes content blob d of this node's store to w (a peer
// pulling an image).
func (im *images) WriteBlob(ctx context.Context, d digest.Digest, size func(int64), w io.Writer) error {
	err := im.rt.WriteBlob(ctx, d, size, w)
	if err != nil && !errdefs.IsNotFound(err) {
		im.log.Warn("image blob not served whole", "digest", d, "err", err)
	}
	return err
}

// sources returns the digest the cluster recorded for image ref
// (publishImages) and the live peers to fetch it from, nearest first by
// Vivaldi RTT estimate (gossip.Cluster.RTT). An image the cluster has no record of
// is not taken from peers.
func (im *images) sources(ctx context.Context, ref string) (string, []runtime.ImageSource, error) {
	// The record is gossiped at import, like the workload that names
	// the image; if the workload came first, give the record a moment.
	want, ok := recordedDigest(im.store, ref)
	for wait := 0; !ok && wait < 15; wait++ {
		select {
		case <-ctx.Done():
			return "", nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		want, ok = recordedDigest(im.store, ref)
	}
	if !ok {
		// No hint here: the runtime's error for an image it cannot get
		// gives it once.
		return "", nil, fmt.Errorf("no node imported %s into the cluster", ref)
	}
	v := im.views.View()
	type peer struct {
		name   string
		status view.NodeStatus
		rtt    time.Duration
	}
	var peers []peer
	for name, s := range v.Statuses {
		if name == im.self || !v.Alive[name] {
			continue
		}
		if _, ok := im.peers.api(name, s); !ok && im.peers.trust == nil {
			continue // --insecure: only peers with a TCP API serve images
		}
		rtt, ok := im.cluster.RTT(name)
		if !ok {
			rtt = time.Hour
		}
		peers = append(peers, peer{name, s, rtt})
	}
	sort.Slice(peers, func(i, j int) bool {
		if peers[i].rtt != peers[j].rtt {
			return peers[i].rtt < peers[j].rtt
		}
		return peers[i].name < peers[j].name
	})
	if len(peers) == 0 {
		return want, nil, errors.New("no live peer to fetch it from (with --insecure, only peers started with --api-listen and --token-file share images)")
	}
	// --max-image-size bounds what one fetch takes from a peer, all its
	// blobs together.
	var out []runtime.ImageSource
	for _, p := range peers {
		var total atomic.Int64
		out = append(out, runtime.ImageSource{Peer: p.name, Blob: func(ctx context.Context, d digest.Digest) (io.ReadCloser, error) {
			// A peer that stalls is given up on after bodyIdleTimeout
			// without data, so the next one gets its turn.
			ctx, cancel := context.WithCancel(ctx)
			idle := time.AfterFunc(apiserver.IdleTimeout, cancel)
			resp, err := im.peers.blob(ctx, p.name, p.status, d)
			if err != nil {
				idle.Stop()
				cancel()
				return nil, fmt.Errorf("blob %s: %w", d, err)
			}
			if d.String() == want {
				im.log.Info("fetching image from peer", "image", ref, "digest", want, "peer", p.name, "rtt", p.rtt)
			}
			return &peerImage{Limited: apiserver.Limited{R: resp.Body, Limit: im.maxBytes, Total: &total}, body: resp.Body, idle: idle, cancel: cancel}, nil
		}})
	}
	return want, out, nil
}

// peerImage is an image blob streamed from a peer: bounded like an
// upload, and abandoned when no data comes for apiserver.IdleTimeout
// (idle cancels the request; every read re-arms it).
type peerImage struct {
	apiserver.Limited
	body   io.Closer
	idle   *time.Timer
	cancel func()
}

func (p *peerImage) Read(b []byte) (int, error) {
	p.idle.Reset(apiserver.IdleTimeout)
	return p.Limited.Read(b)
}

func (p *peerImage) Close() error {
	p.idle.Stop()
	p.cancel()
	return p.body.Close()
}
