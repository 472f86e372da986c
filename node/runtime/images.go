package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// NormalizeImage returns the full name of image reference ref, as
// containerd and Docker store it: "nginx" -> "docker.io/library/nginx:latest",
// "nginx:1.22" -> "docker.io/library/nginx:1.22", "ghcr.io/a/b@sha256:..."
// unchanged (digests are kept). A reference that does not parse is
// returned as is (manifest validation refuses those at apply).
func NormalizeImage(ref string) string {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return ref
	}
	return named.String()
}

// imageName names image ref in a message as the user wrote it, with its
// full name when that differs: "nginx:1.22 (docker.io/library/nginx:1.22)".
func imageName(ref string) string {
	if full := NormalizeImage(ref); full != ref {
		return ref + " (" + full + ")"
	}
	return ref
}

// Image pull policies (a container's imagePullPolicy, as the kubelet
// honours it with containerd).
const (
	// PullIfNotPresent uses the node's copy when it has one; else the
	// nearest peer's, else the registry's. "" means this.
	PullIfNotPresent = "IfNotPresent"
	// PullAlways takes the image the cluster holds as current: the one
	// last imported under ref (its digest gossiped with the import), from
	// this node when its copy has that digest, else from a peer; for an
	// image no node imported, the registry's. It never falls back to a
	// local copy of another digest.
	PullAlways = "Always"
	// PullNever uses the node's copy only.
	PullNever = "Never"
)

// EnsureImage returns image ref (any reference a Deployment may name,
// normalized by NormalizeImage), unpacked, as pull policy policy
// (PullIfNotPresent, PullAlways, PullNever) asks. Errors name the image,
// the policy when it decided, every source tried and what to do.
func (r *Runtime) EnsureImage(ctx context.Context, ref, policy string, creds map[string]reconcile.RegistryCred) (containerd.Image, error) {
	ctx = r.ctx(ctx)
	full := NormalizeImage(ref)
	var img containerd.Image
	var err error
	switch policy {
	case PullNever:
		img, err = r.client.GetImage(ctx, full)
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("image %s is not on this node and imagePullPolicy is Never (ErrImageNeverPull): import it on this node with 'starling image import FILE.tar', or set imagePullPolicy: IfNotPresent to take it from a peer or its registry", imageName(ref))
		}
	case PullAlways:
		img, err = r.pullAlways(ctx, ref, full, creds)
		if err != nil {
			return nil, err
		}
	default:
		img, err = r.client.GetImage(ctx, full)
		if errdefs.IsNotFound(err) {
			img, err = r.fetch(ctx, ref, full, creds)
			if err != nil {
				return nil, err
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", imageName(ref), err)
	}
	if ok, err := img.IsUnpacked(ctx, r.cfg.Snapshotter); err != nil || !ok {
		untrack := r.transfers.unpacking(full)
		err := img.Unpack(ctx, r.cfg.Snapshotter)
		untrack()
		if err != nil {
			return nil, fmt.Errorf("unpack image %s: %w", imageName(ref), err)
		}
	}
	return img, nil
}

// fetch gets image full (ref as the user wrote it), which this node does
// not hold, from the nearest peer that has it, else from its registry.
func (r *Runtime) fetch(ctx context.Context, ref, full string, creds map[string]reconcile.RegistryCred) (containerd.Image, error) {
	// Peers first: an edge cluster often has no registry, or a slow or
	// unreachable one (a failing DNS lookup alone costs ~10 s per
	// create), and a peer's copy is what the other nodes run.
	var peerErr error = errors.New("no peer image source")
	if r.cfg.FetchImage != nil {
		var want string
		var sources []ImageSource
		if want, sources, peerErr = r.cfg.FetchImage(ctx, full); peerErr == nil {
			img, err := r.fetchFromPeers(ctx, full, want, sources)
			if err == nil {
				return img, nil
			}
			peerErr = err
		}
	}
	img, err := r.pullRegistry(ctx, full, creds)
	if err != nil {
		return nil, fmt.Errorf("image %s is not on this node and could not be fetched (peers: %v; registry: %v): import it on any node with 'starling image import FILE.tar' (an OCI or 'docker save' tarball)", imageName(ref), peerErr, err)
	}
	return img, nil
}

// pullAlways is EnsureImage for PullAlways: the digest the cluster
// recorded for full at its last import, from this node's copy if it has
// that digest, else from a peer; for an image no node imported, the
// registry's current one. A copy of another digest is never used.
func (r *Runtime) pullAlways(ctx context.Context, ref, full string, creds map[string]reconcile.RegistryCred) (containerd.Image, error) {
	var want string
	var sources []ImageSource
	peerErr := errors.New("no peer image source")
	if r.cfg.FetchImage != nil {
		want, sources, peerErr = r.cfg.FetchImage(ctx, full)
	}
	if want == "" {
		img, err := r.pullRegistry(ctx, full, creds)
		if err != nil {
			return nil, fmt.Errorf("image %s resolves nowhere and imagePullPolicy is Always (ErrImagePull): no node imported it (%v) and its registry failed (%v); import it on any node with 'starling image import FILE.tar', or set imagePullPolicy: IfNotPresent to run the copy a node holds", imageName(ref), peerErr, err)
		}
		return img, nil
	}
	if img, err := r.client.GetImage(ctx, full); err == nil && img.Target().Digest.String() == want {
		return img, nil
	}
	if peerErr == nil {
		var img containerd.Image
		if img, peerErr = r.fetchFromPeers(ctx, full, want, sources); peerErr == nil {
			return img, nil
		}
	}
	return nil, fmt.Errorf("image %s: imagePullPolicy is Always and the copy the cluster holds as current (%s, its last import) could not be fetched (%v) (ErrImagePull); this node's copy, if any, is another digest and is not used: check that a node holding it is up, or import it again", imageName(ref), want, peerErr)
}

// pullRegistry pulls full from its registry and unpacks it, with the
// credentials creds holds for the registry's host (a replica's
// imagePullSecrets), over plain HTTP for a host of
// Config.InsecureRegistries (and localhost), else HTTPS.
func (r *Runtime) pullRegistry(ctx context.Context, full string, creds map[string]reconcile.RegistryCred) (containerd.Image, error) {
	authorizer := docker.NewDockerAuthorizer(docker.WithAuthClient(registryClient), docker.WithAuthCreds(func(host string) (string, string, error) {
		c := creds[host]
		return c.Username, c.Password, nil
	}))
	plain := func(host string) (bool, error) {
		if slices.Contains(r.cfg.InsecureRegistries, host) {
			return true, nil
		}
		return docker.MatchLocalhost(host)
	}
	hosts := docker.ConfigureDefaultRegistries(docker.WithClient(registryClient), docker.WithAuthorizer(authorizer), docker.WithPlainHTTP(plain))
	return r.client.Pull(ctx, full, containerd.WithPullUnpack, containerd.WithPullSnapshotter(r.cfg.Snapshotter),
		containerd.WithResolver(docker.NewResolver(docker.ResolverOptions{Hosts: hosts})))
}

// registryClient is the HTTP client of registry pulls (registries and
// their token servers). containerd 2's resolver tries a request up to 5
// times when it fails with a timeout, and a registry that cannot be
// reached at all (its name's lookup or its connection times out, as on
// an edge node whose DNS server is away) made a replica wait 5 times as
// long for its image's failure: 50 s instead of 10 s for a lookup. A
// connection that cannot be made fails once, as with containerd 1.7; a
// connected request that times out is still tried again.
var registryClient = &http.Client{Transport: connectOnce{docker.DefaultHTTPTransport(nil)}}

// connectOnce reports a failed connection (lookup or connect) without
// its timeout, which containerd's resolver would retry; the message is
// kept.
type connectOnce struct{ http.RoundTripper }

func (t connectOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.RoundTripper.RoundTrip(req)
	var op *net.OpError
	if err != nil && errors.As(err, &op) && op.Op == "dial" {
		return nil, errors.New(err.Error())
	}
	return resp, err
}

func imageConfig(ctx context.Context, img containerd.Image) (ocispec.ImageConfig, error) {
	desc, err := img.Config(ctx)
	if err != nil {
		return ocispec.ImageConfig{}, err
	}
	var ic ocispec.Image
	b, err := content.ReadBlob(ctx, img.ContentStore(), desc)
	if err != nil {
		return ocispec.ImageConfig{}, err
	}
	if err := json.Unmarshal(b, &ic); err != nil {
		return ocispec.ImageConfig{}, err
	}
	return ic.Config, nil
}

// ImportImages loads an OCI or docker-archive tarball into the node's
// image store, unpacks every image in it and returns their names.
func (r *Runtime) ImportImages(ctx context.Context, tar io.Reader) ([]string, error) {
	ctx = r.ctx(ctx)
	// containerd's Import updates a name, else creates it: a pull from a
	// peer that created the name in between would fail the import.
	r.imageNames.Lock()
	imgs, err := r.client.Import(ctx, tar, containerd.WithAllPlatforms(false))
	r.imageNames.Unlock()
	if err != nil {
		return nil, fmt.Errorf("import images: %w (the file must be an OCI or docker-archive tarball)", err)
	}
	var names []string
	for _, i := range imgs {
		img := containerd.NewImage(r.client, i)
		if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
			return names, fmt.Errorf("unpack %s: %w", i.Name, err)
		}
		names = append(names, i.Name)
	}
	return names, nil
}

// ImageDigest returns the digest of image ref's target ("sha256:...");
// ref is normalized (NormalizeImage).
func (r *Runtime) ImageDigest(ctx context.Context, ref string) (string, error) {
	img, err := r.client.ImageService().Get(r.ctx(ctx), NormalizeImage(ref))
	if err != nil {
		return "", err
	}
	return img.Target.Digest.String(), nil
}

// HasImage reports whether the node stores image ref (normalized).
func (r *Runtime) HasImage(ctx context.Context, ref string) bool {
	_, err := r.client.ImageService().Get(r.ctx(ctx), NormalizeImage(ref))
	return err == nil
}

// Images lists the images stored on the node.
func (r *Runtime) Images(ctx context.Context) ([]api.Image, error) {
	ctx = r.ctx(ctx)
	imgs, err := r.client.ImageService().List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Image, 0, len(imgs))
	for _, i := range imgs {
		// The unpacked-independent size: manifest, config and layers.
		size, err := containerd.NewImage(r.client, i).Size(ctx)
		if err != nil {
			size = i.Target.Size
		}
		out = append(out, api.Image{Name: i.Name, Digest: i.Target.Digest.String(), Size: size})
	}
	return out, nil
}
