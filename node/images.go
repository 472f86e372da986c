package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/dustin/go-humanize"
	"github.com/opencontainers/go-digest"

	"github.com/starling-orchestrator/starling/gossip/crdt"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/runtime"
	"github.com/starling-orchestrator/starling/node/store"
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
func recordedDigest(st *store.Store, name string) (string, bool) {
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

func (a *Agent) handleImageImport(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	body := &limitedImage{r: r.Body, limit: a.cfg.MaxImageBytes, rc: rc}
	names, err := a.rt.ImportImages(r.Context(), body)
	if err != nil || body.over {
		// The connection closes after the answer, with the idle
		// deadline left in place: nothing waits on the rest.
		w.Header().Set("Connection", "close")
	} else {
		rc.SetReadDeadline(time.Time{})
	}
	switch {
	case body.over:
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("image import: the tarball is over %s, the limit of node %s (agent --max-image-size)",
			humanize.IBytes(uint64(a.cfg.MaxImageBytes)), a.cfg.Name))
		return
	case errors.Is(err, os.ErrDeadlineExceeded):
		writeError(w, http.StatusRequestTimeout, fmt.Errorf("image import: no data for %s; the upload was cut", bodyIdleTimeout))
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if err := a.publishImages(r.Context(), names); err != nil {
		writeError(w, http.StatusInternalServerError, fmt.Errorf("image import: imported %s but could not record their digests for the cluster: %w", strings.Join(names, ", "), err))
		return
	}
	a.acts.resetFailures()
	a.requestReconcile()
	out := api.ImageList{Items: []api.Image{}}
	for _, n := range names {
		out.Items = append(out.Items, api.Image{Name: n})
	}
	writeJSON(w, http.StatusOK, out)
}

// handleImageBlob serves blob {digest} of this node's content store (a
// manifest, config or layer), for peers pulling an image
// (runtime.fetchFromPeers): content-addressed, so the puller checks what
// it gets against the digest it asked for.
func (a *Agent) handleImageBlob(w http.ResponseWriter, r *http.Request) {
	d, err := digest.Parse(r.PathValue("digest"))
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("digest: %v (want sha256:<64 hex digits>)", err))
		return
	}
	started := false
	err = a.rt.WriteBlob(r.Context(), d, func(size int64) {
		started = true
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}, w)
	switch {
	case err == nil:
	case !started && errdefs.IsNotFound(err):
		writeError(w, http.StatusNotFound, fmt.Errorf("node %s holds no blob %s", a.cfg.Name, d))
	case !started:
		writeError(w, http.StatusInternalServerError, err)
	default:
		a.log.Warn("image blob not served whole", "digest", d, "err", err)
	}
}

// imageSources returns the digest the cluster recorded for image ref
// (images.go) and the live peers to fetch it from, nearest first by
// Vivaldi RTT estimate (peerGet). An image the cluster has no record of
// is not taken from peers.
func (a *Agent) imageSources(ctx context.Context, ref string) (string, []runtime.ImageSource, error) {
	// The record is gossiped at import, like the workload that names
	// the image; if the workload came first, give the record a moment.
	want, ok := recordedDigest(a.store, ref)
	for wait := 0; !ok && wait < 15; wait++ {
		select {
		case <-ctx.Done():
			return "", nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		want, ok = recordedDigest(a.store, ref)
	}
	if !ok {
		return "", nil, fmt.Errorf("no node imported %s into the cluster (import it with 'starling image import FILE.tar' on any node)", ref)
	}
	v := a.view()
	type peer struct {
		name   string
		status NodeStatus
		rtt    time.Duration
	}
	var peers []peer
	for name, s := range v.statuses {
		if name == a.cfg.Name || !v.alive[name] {
			continue
		}
		if _, ok := a.peerAPI(name, s); !ok && a.trust == nil {
			continue // --insecure: only peers with a TCP API serve images
		}
		rtt, ok := a.cluster.RTT(name)
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
		return "", nil, errors.New("no live peer to fetch it from (with --insecure, only peers started with --api-listen and --token-file share images)")
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
			idle := time.AfterFunc(bodyIdleTimeout, cancel)
			resp, err := a.peerGet(ctx, p.name, p.status, d)
			if err != nil {
				idle.Stop()
				cancel()
				return nil, fmt.Errorf("blob %s: %w", d, err)
			}
			if d.String() == want {
				a.log.Info("fetching image from peer", "image", ref, "digest", want, "peer", p.name, "rtt", p.rtt)
			}
			return &peerImage{limitedImage: limitedImage{r: resp.Body, limit: a.cfg.MaxImageBytes, total: &total}, body: resp.Body, idle: idle, cancel: cancel}, nil
		}})
	}
	return want, out, nil
}
