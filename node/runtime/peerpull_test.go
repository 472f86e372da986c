package runtime

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	containerdtransfer "github.com/containerd/containerd/v2/core/transfer"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// blobSource serves blobs from a map, whatever digest they truly have.
func blobSource(blobs map[digest.Digest][]byte) ImageSource {
	return ImageSource{Peer: "p", Blob: func(_ context.Context, d digest.Digest) (io.ReadCloser, error) {
		b, ok := blobs[d]
		if !ok {
			return nil, errors.New("404 Not Found")
		}
		return io.NopCloser(bytes.NewReader(b)), nil
	}}
}

// The resolver takes the manifest of the recorded digest only, with the
// media type its content says, and refuses other content under that
// digest, oversized manifests and blobs that are no manifest.
func TestPeerResolverTakesOnlyTheRecordedManifest(t *testing.T) {
	docker := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{},"layers":[]}`)
	oci := []byte(`{"schemaVersion":2,"config":{"digest":"sha256:00"},"layers":[]}`)
	index := []byte(`{"schemaVersion":2,"manifests":[]}`)
	for _, tc := range []struct {
		name    string
		served  []byte
		want    digest.Digest
		media   string
		wantErr string
	}{
		{"docker manifest", docker, digest.FromBytes(docker), images.MediaTypeDockerSchema2Manifest, ""},
		{"OCI manifest without mediaType", oci, digest.FromBytes(oci), ocispec.MediaTypeImageManifest, ""},
		{"OCI index without mediaType", index, digest.FromBytes(index), ocispec.MediaTypeImageIndex, ""},
		{"other content under the digest", oci, digest.FromBytes(docker), "", "it served content of digest " + digest.FromBytes(oci).String()},
		{"a layer's media type", []byte(`{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip"}`), "", "", "is not an image manifest or index"},
		{"not JSON", []byte("\x1f\x8b"), "", "", "not a manifest"},
		{"too large", bytes.Repeat([]byte(" "), maxManifestBytes+1), "", "", "over 4194304 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want == "" {
				want = digest.FromBytes(tc.served)
			}
			p := &peerResolver{src: blobSource(map[digest.Digest][]byte{want: tc.served}), ref: "docker.io/library/x:1", want: want, counted: new(atomic.Int64)}
			name, desc, err := p.Resolve(context.Background(), "docker.io/library/x:1")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || name != "docker.io/library/x:1" || desc.Digest != want || desc.MediaType != tc.media || desc.Size != int64(len(tc.served)) {
				t.Fatalf("got %s %+v %v", name, desc, err)
			}
		})
	}
	p := &peerResolver{src: blobSource(nil), ref: "docker.io/library/x:1", want: digest.FromBytes(docker), counted: new(atomic.Int64)}
	if _, _, err := p.Resolve(context.Background(), "docker.io/library/other:1"); err == nil {
		t.Fatal("resolved a name other than the one it was made for")
	}
}

// The fetcher serves the resolved manifest from memory and counts the
// bytes of the other blobs for the transfer's progress.
func TestPeerFetcherCountsBlobBytes(t *testing.T) {
	manifest := []byte(`{"schemaVersion":2,"config":{},"layers":[]}`)
	layer := bytes.Repeat([]byte("l"), 5000)
	md, ld := digest.FromBytes(manifest), digest.FromBytes(layer)
	asked := 0
	src := blobSource(map[digest.Digest][]byte{md: manifest, ld: layer})
	open := src.Blob
	src.Blob = func(ctx context.Context, d digest.Digest) (io.ReadCloser, error) { asked++; return open(ctx, d) }
	p := &peerResolver{src: src, ref: "r", want: md, counted: new(atomic.Int64)}
	if _, _, err := p.Resolve(context.Background(), "r"); err != nil {
		t.Fatal(err)
	}
	f, _ := p.Fetcher(context.Background(), "r")
	for _, d := range []digest.Digest{md, ld} {
		rc, err := f.Fetch(context.Background(), ocispec.Descriptor{Digest: d})
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, rc)
		rc.Close()
	}
	if asked != 2 || p.counted.Load() != int64(len(layer)) {
		t.Fatalf("peer asked %d times (want 2: manifest once, layer), %d bytes counted (want %d)", asked, p.counted.Load(), len(layer))
	}
}

// A peer that sends more than a blob's size is refused before the extra
// bytes reach containerd (content.Copy reads to the end), and the pull
// remembers what it fetched, whose partial writes it drops if it fails.
func TestPeerFetcherRefusesBytesPastTheBlobsSize(t *testing.T) {
	layer := bytes.Repeat([]byte("l"), 5000)
	ld := digest.FromBytes(layer)
	src := blobSource(map[digest.Digest][]byte{ld: append(slices.Clone(layer), "more"...)})
	p := &peerResolver{src: src, ref: "r", want: digest.FromString("m"), counted: new(atomic.Int64)}
	f, _ := p.Fetcher(context.Background(), "r")
	desc := ocispec.Descriptor{Digest: ld, Size: int64(len(layer)), MediaType: ocispec.MediaTypeImageLayer}
	rc, err := f.Fetch(context.Background(), desc)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err == nil || !strings.Contains(err.Error(), "more than its 5000 bytes") {
		t.Fatalf("read %d bytes, err %v; want an error for the bytes past 5000", len(got), err)
	}
	if len(got) != len(layer) {
		t.Fatalf("read %d bytes, want at most the blob's %d", len(got), len(layer))
	}
	if ds := p.fetched(); len(ds) != 1 || ds[0].Digest != ld {
		t.Fatalf("fetched %v, want the layer", ds)
	}
	// An exact blob reads to its end.
	src2 := blobSource(map[digest.Digest][]byte{ld: layer})
	p2 := &peerResolver{src: src2, ref: "r", want: digest.FromString("m"), counted: new(atomic.Int64)}
	f2, _ := p2.Fetcher(context.Background(), "r")
	rc2, err := f2.Fetch(context.Background(), desc)
	if err != nil {
		t.Fatal(err)
	}
	defer rc2.Close()
	if got, err := io.ReadAll(rc2); err != nil || !bytes.Equal(got, layer) {
		t.Fatalf("exact blob: %d bytes, err %v", len(got), err)
	}
}

// The fetcher keeps to the pull's bound on concurrent downloads
// (containerd.WithMaxConcurrentDownloads, which containerd 2 hands the
// resolver): a fourth blob waits until one of three open ones is closed,
// and a blob the peer refuses gives its place back.
func TestPeerFetcherFetchesAtMostThreeBlobsAtOnce(t *testing.T) {
	blobs := map[digest.Digest][]byte{}
	var ds []digest.Digest
	for i := range 4 {
		b := []byte(strings.Repeat("l", i+1))
		blobs[digest.FromBytes(b)] = b
		ds = append(ds, digest.FromBytes(b))
	}
	p := &peerResolver{src: blobSource(blobs), ref: "r", want: digest.FromString("m"), counted: new(atomic.Int64)}
	p.SetOptions(containerdtransfer.WithMaxConcurrentDownloads(3), containerdtransfer.WithDownloadLimiter(nil))
	f, _ := p.Fetcher(context.Background(), "r")
	var open []io.ReadCloser
	for _, d := range ds[:3] {
		rc, err := f.Fetch(context.Background(), ocispec.Descriptor{Digest: d})
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, rc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := f.Fetch(ctx, ocispec.Descriptor{Digest: ds[3]}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a fourth blob while three are open: err %v, want it to wait", err)
	}
	open[0].Close()
	open[0].Close() // a second Close gives back nothing more
	if _, err := f.Fetch(context.Background(), ocispec.Descriptor{Digest: digest.FromString("absent")}); err == nil {
		t.Fatal("an absent blob fetched")
	}
	rc, err := f.Fetch(context.Background(), ocispec.Descriptor{Digest: ds[3]})
	if err != nil {
		t.Fatalf("after a close and a refused blob: %v", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	if _, err := f.Fetch(ctx2, ocispec.Descriptor{Digest: ds[0]}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("three open again, yet another blob: err %v, want it to wait", err)
	}
	rc.Close()
	open[1].Close()
	open[2].Close()
}
