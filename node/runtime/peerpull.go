package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	containerdtransfer "github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/semaphore"
)

// Images from peers. A node that lacks an image pulls it from a peer as
// it would from a registry, blob by blob, with containerd's own pull
// (containerd's client.Pull with a resolver of ours): from the manifest (or index) of
// the digest the cluster recorded down to the layers; blobs the node
// already holds are not fetched (images that share base layers share
// them), layers are fetched three at a time and unpacked as they arrive,
// and every blob is checked against its digest as it is stored. The one
// image created is ref at the recorded digest.
//
// It replaced a tarball of the whole image (containerd's archive export
// and import), which cost 4x a plain copy over the same link: 96 MB/s
// against 381 MB/s for a copy into a file (`go run ./test/bench -only
// image`), because both ends streamed blobs through containerd's content
// API 32 KiB at a time (146 MB/s on reads alone, 730 MB/s in 4 MiB reads).

// ImageSource is one peer that may serve an image's blobs.
type ImageSource struct {
	Peer string
	// Blob opens the blob of digest d from the peer; the caller checks
	// what it reads against d.
	Blob func(ctx context.Context, d digest.Digest) (io.ReadCloser, error)
}

// maxManifestBytes bounds a manifest or index from a peer (it is read
// whole): real ones are a few KiB.
const maxManifestBytes = 4 << 20

// BlobChunk is the size of the reads and writes that move a blob through
// containerd's content API: one gRPC round trip each.
const BlobChunk = 1 << 20

// fetchFromPeers pulls ref at digest want from sources (what FetchImage
// returned), best first, until one succeeds.
func (r *Runtime) fetchFromPeers(ctx context.Context, ref, want string, sources []ImageSource) (containerd.Image, error) {
	wantDigest, err := digest.Parse(want)
	if err != nil {
		return nil, fmt.Errorf("recorded digest of %s: %w", ref, err)
	}
	var errs []error
	for _, src := range sources {
		img, err := r.pullFrom(ctx, src, ref, wantDigest)
		if err != nil {
			r.log.Warn("image from peer refused", "image", ref, "digest", wantDigest, "peer", src.Peer, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", src.Peer, err))
			continue
		}
		r.log.Info("image fetched from a peer", "image", ref, "digest", wantDigest, "peer", src.Peer)
		return img, nil
	}
	if len(errs) == 0 {
		return nil, errors.New("no peer to fetch from")
	}
	return nil, errors.Join(errs...)
}

// pullFrom pulls ref at digest want from src and unpacks it.
func (r *Runtime) pullFrom(ctx context.Context, src ImageSource, ref string, want digest.Digest) (containerd.Image, error) {
	counted, untrack := r.transfers.track(ref, src.Peer)
	defer untrack()
	r.imageNames.RLock()
	defer r.imageNames.RUnlock()
	res := &peerResolver{src: src, ref: ref, want: want, counted: counted}
	img, err := r.client.Pull(r.ctx(ctx), ref, containerd.WithResolver(res), containerd.WithPullUnpack,
		containerd.WithPullSnapshotter(r.cfg.Snapshotter), containerd.WithMaxConcurrentDownloads(3))
	if err != nil {
		r.abortIngests(ctx, res.fetched())
	}
	return img, err
}

// abortIngests drops containerd's partial writes (ingests) of the blobs
// descs, named as containerd's pull names them (remotes.MakeRefKey). A
// failed commit (content of another digest) leaves its ingest behind, and
// the next pull of that blob, from any peer, resumes it: it would never
// verify, and every later pull of the image would fail ("unable to resume
// write", "unexpected commit digest").
func (r *Runtime) abortIngests(ctx context.Context, descs []ocispec.Descriptor) {
	// Also after the pull's own context ended (its deadline, a stop).
	ctx, cancel := context.WithTimeout(r.ctx(context.WithoutCancel(ctx)), 10*time.Second)
	defer cancel()
	cs := r.client.ContentStore()
	for _, d := range descs {
		if err := cs.Abort(ctx, remotes.MakeRefKey(ctx, d)); err != nil && !errdefs.IsNotFound(err) {
			r.log.Warn("drop a failed pull's partial blob", "digest", d.Digest, "err", err)
		}
	}
}

// peerResolver resolves one name, ref, to the descriptor of digest want,
// whatever the peer says, and fetches blobs from the peer by digest.
type peerResolver struct {
	src     ImageSource
	ref     string
	want    digest.Digest
	counted *atomic.Int64
	// top is the manifest or index of digest want, read by Resolve.
	top []byte
	// limit bounds the blobs fetched at once (SetOptions; nil: no
	// bound).
	limit *semaphore.Weighted

	mu    sync.Mutex
	descs []ocispec.Descriptor // the blobs fetched (up to 3 at once)
}

// fetched lists the blobs the pull asked the fetcher for.
func (p *peerResolver) fetched() []ocispec.Descriptor {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.descs)
}

// Resolve reads the blob of digest want from the peer, checks it, and
// returns its descriptor with the media type its content declares (a
// peer's word on it is never asked for).
func (p *peerResolver) Resolve(ctx context.Context, ref string) (string, ocispec.Descriptor, error) {
	if ref != p.ref {
		return "", ocispec.Descriptor{}, fmt.Errorf("resolve %s: only %s is resolved here", ref, p.ref)
	}
	rc, err := p.src.Blob(ctx, p.want)
	if err != nil {
		return "", ocispec.Descriptor{}, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxManifestBytes+1))
	if err != nil {
		return "", ocispec.Descriptor{}, fmt.Errorf("read %s: %w", p.want, err)
	}
	if len(b) > maxManifestBytes {
		return "", ocispec.Descriptor{}, fmt.Errorf("the manifest of %s is over %d bytes", p.want, maxManifestBytes)
	}
	if got := p.want.Algorithm().FromBytes(b); got != p.want {
		return "", ocispec.Descriptor{}, fmt.Errorf("it served content of digest %s for %s", got, p.want)
	}
	mt, err := manifestMediaType(b)
	if err != nil {
		return "", ocispec.Descriptor{}, fmt.Errorf("%s: %w", p.want, err)
	}
	p.top = b
	return ref, ocispec.Descriptor{MediaType: mt, Digest: p.want, Size: int64(len(b))}, nil
}

// containerd's Pull hands a resolver with options its download bound.
var _ remotes.ResolverWithOptions = (*peerResolver)(nil)

// SetOptions takes the pull's bound on concurrent downloads
// (containerd.WithMaxConcurrentDownloads): containerd 2's client leaves
// it to the resolver, where 1.7's bounded its own dispatch.
func (p *peerResolver) SetOptions(opts ...containerdtransfer.ImageResolverOption) {
	var o containerdtransfer.ImageResolverOptions
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case o.DownloadLimiter != nil:
		p.limit = o.DownloadLimiter
	case o.Performances.MaxConcurrentDownloads > 0:
		p.limit = semaphore.NewWeighted(int64(o.Performances.MaxConcurrentDownloads))
	}
}

// Fetcher fetches ref's blobs from the peer, as many at once as
// SetOptions allows: a blob holds its place until its reader is closed.
func (p *peerResolver) Fetcher(ctx context.Context, ref string) (remotes.Fetcher, error) {
	return remotes.FetcherFunc(func(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
		if desc.Digest == p.want && p.top != nil {
			return io.NopCloser(bytes.NewReader(p.top)), nil
		}
		p.mu.Lock()
		p.descs = append(p.descs, desc)
		p.mu.Unlock()
		release := func() {}
		if p.limit != nil {
			if err := p.limit.Acquire(ctx, 1); err != nil {
				return nil, err
			}
			release = sync.OnceFunc(func() { p.limit.Release(1) })
		}
		rc, err := p.src.Blob(ctx, desc.Digest)
		if err != nil {
			release()
			return nil, err
		}
		rc = releasingCloser{rc, release}
		// content.Copy reads to the end and then checks size and
		// digest: what a peer sends past desc.Size is refused before it
		// reaches the disk.
		var r io.Reader = rc
		if desc.Size > 0 {
			r = &sizedReader{r: rc, left: desc.Size, desc: desc}
		}
		return countingReadCloser{struct {
			io.Reader
			io.Closer
		}{r, rc}, p.counted}, nil
	}), nil
}

// Pusher: nothing is pushed to peers.
func (p *peerResolver) Pusher(ctx context.Context, ref string) (remotes.Pusher, error) {
	return nil, errors.New("images are not pushed to peers")
}

// manifestMediaType returns the media type of manifest or index b: its
// mediaType field when it has one of the four kinds containerd unpacks,
// else what its fields make it (an OCI index has manifests, an OCI
// manifest has a config).
func manifestMediaType(b []byte) (string, error) {
	var m struct {
		MediaType string          `json:"mediaType"`
		Manifests json.RawMessage `json:"manifests"`
		Config    json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return "", fmt.Errorf("not a manifest: %w", err)
	}
	switch m.MediaType {
	case ocispec.MediaTypeImageIndex, ocispec.MediaTypeImageManifest, images.MediaTypeDockerSchema2ManifestList, images.MediaTypeDockerSchema2Manifest:
		return m.MediaType, nil
	case "":
		switch {
		case m.Manifests != nil:
			return ocispec.MediaTypeImageIndex, nil
		case m.Config != nil:
			return ocispec.MediaTypeImageManifest, nil
		}
		return "", errors.New("neither a manifest nor an index")
	}
	return "", fmt.Errorf("media type %q is not an image manifest or index", m.MediaType)
}

// sizedReader reads the desc.Size bytes of a blob and fails if its
// source holds more.
type sizedReader struct {
	r    io.Reader
	left int64
	desc ocispec.Descriptor
}

func (s *sizedReader) Read(p []byte) (int, error) {
	if s.left <= 0 {
		var one [1]byte
		if n, _ := s.r.Read(one[:]); n > 0 {
			return 0, fmt.Errorf("blob %s: the peer sent more than its %d bytes", s.desc.Digest, s.desc.Size)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	n, err := s.r.Read(p)
	s.left -= int64(n)
	return n, err
}

// releasingCloser calls release after closing its ReadCloser.
type releasingCloser struct {
	io.ReadCloser
	release func()
}

func (r releasingCloser) Close() error {
	defer r.release()
	return r.ReadCloser.Close()
}

type countingReadCloser struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c countingReadCloser) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// WriteBlob writes the blob of digest d, if this node stores it, to w in
// BlobChunk reads; size is called with its size before the first byte.
// Errors: errdefs.ErrNotFound for a blob the node does not hold.
func (r *Runtime) WriteBlob(ctx context.Context, d digest.Digest, size func(int64), w io.Writer) error {
	ctx = r.ctx(ctx)
	cs := r.client.ContentStore()
	info, err := cs.Info(ctx, d)
	if err != nil {
		return err
	}
	ra, err := cs.ReaderAt(ctx, ocispec.Descriptor{Digest: d, Size: info.Size})
	if err != nil {
		return err
	}
	defer ra.Close()
	size(info.Size)
	// Plain Reader and Writer: neither side's ReadFrom/WriteTo may pick a
	// smaller buffer (http's response would copy 32 KiB at a time).
	_, err = io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{content.NewReader(ra)}, make([]byte, BlobChunk))
	return err
}
