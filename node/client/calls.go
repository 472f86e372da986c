package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/starling-orchestrator/starling/node/api"
)

// Version is GET /v1/version: the agent's version and node name.
func (c *Client) Version(ctx context.Context) (api.Version, error) {
	var v api.Version
	return v, c.call(ctx, api.RouteVersion, nil, nil, &v)
}

// Apply stores objects (their canonical JSON, manifest.Encode) as one
// request: all are validated before any is stored.
func (c *Client) Apply(ctx context.Context, req api.ApplyRequest) ([]api.ApplyResult, error) {
	var out api.ApplyResponse
	err := c.call(ctx, api.RouteApply, nil, req, &out)
	return out.Results, err
}

// List returns the stored objects of kind ("deployment", "statefulset",
// "service", or a kind alias).
func (c *Client) List(ctx context.Context, kind string) ([]api.Object, error) {
	var out api.ObjectList
	err := c.call(ctx, api.RouteObjects, nil, nil, &out, strings.ToLower(kind))
	return out.Items, err
}

// Get returns one stored object; apierrors.IsNotFound when there is none.
func (c *Client) Get(ctx context.Context, kind, namespace, name string) (api.Object, error) {
	var out api.Object
	err := c.call(ctx, api.RouteObject, nil, nil, &out, strings.ToLower(kind), namespace, name)
	return out, err
}

// Delete deletes one object; apierrors.IsNotFound when there is none.
func (c *Client) Delete(ctx context.Context, kind, namespace, name string) (api.ApplyResult, error) {
	var out api.ApplyResult
	err := c.call(ctx, api.RouteDeleteObject, nil, nil, &out, strings.ToLower(kind), namespace, name)
	return out, err
}

// Scale sets the replicas of a Deployment or StatefulSet (kind).
func (c *Client) Scale(ctx context.Context, kind, namespace, name string, replicas int32) (api.ApplyResult, error) {
	var out api.ApplyResult
	q := url.Values{"kind": {strings.ToLower(kind)}}
	err := c.call(ctx, api.RouteScale, q, api.ScaleRequest{Replicas: replicas}, &out, namespace, name)
	return out, err
}

// Replicas returns every replica of the cluster as the agent sees it.
func (c *Client) Replicas(ctx context.Context) ([]api.Replica, error) {
	var out api.ReplicaList
	err := c.call(ctx, api.RouteReplicas, nil, nil, &out)
	return out.Items, err
}

// Nodes returns the cluster's members.
func (c *Client) Nodes(ctx context.Context) ([]api.Node, error) {
	var out api.NodeList
	err := c.call(ctx, api.RouteNodes, nil, nil, &out)
	return out.Items, err
}

// ForgetNode forgets a dead or departed node (apierrors.IsConflict for a
// live one).
func (c *Client) ForgetNode(ctx context.Context, name string) (api.ForgetResult, error) {
	var out api.ForgetResult
	err := c.call(ctx, api.RouteForgetNode, nil, nil, &out, name)
	return out, err
}

// ClientConfig returns what a CLI needs to reach this agent over TCP.
func (c *Client) ClientConfig(ctx context.Context) (api.ClientConfig, error) {
	var out api.ClientConfig
	err := c.call(ctx, api.RouteClientConfig, nil, nil, &out)
	return out, err
}

// RotateKeys rotates the cluster's gossip key from this agent.
func (c *Client) RotateKeys(ctx context.Context) (api.KeyRotation, error) {
	var out api.KeyRotation
	err := c.call(ctx, api.RouteRotateKeys, nil, struct{}{}, &out)
	return out, err
}

// Logs streams a replica's log; the caller closes it.
func (c *Client) Logs(ctx context.Context, namespace, name string, o api.LogOptions) (io.ReadCloser, error) {
	resp, err := c.Request(ctx, api.RouteLogs, o.Query(), nil, namespace, name)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ImportImages streams an image tarball (OCI or docker-archive) into the
// agent's image store and returns the images it held.
func (c *Client) ImportImages(ctx context.Context, tarball io.Reader) ([]api.Image, error) {
	var out api.ImageList
	err := c.call(ctx, api.RouteImportImages, nil, Stream{Body: tarball, ContentType: "application/x-tar"}, &out)
	return out.Items, err
}

// Images lists the agent's images.
func (c *Client) Images(ctx context.Context) ([]api.Image, error) {
	var out api.ImageList
	err := c.call(ctx, api.RouteImages, nil, nil, &out)
	return out.Items, err
}

// Blob streams the content blob with the given digest from an agent's
// store (a peer pulling an image); the caller closes the response body.
func (c *Client) Blob(ctx context.Context, digest string) (*http.Response, error) {
	return c.Request(ctx, api.RoutePeerBlob, nil, nil, digest)
}

// RolloutStatus is the progress of a Deployment's rollout.
func (c *Client) RolloutStatus(ctx context.Context, namespace, name string) (api.RolloutStatus, error) {
	var out api.RolloutStatus
	err := c.call(ctx, api.RouteRollout, nil, nil, &out, namespace, name)
	return out, err
}

// RolloutHistory lists a Deployment's revisions, oldest first.
func (c *Client) RolloutHistory(ctx context.Context, namespace, name string) ([]api.Revision, error) {
	var out api.RevisionList
	err := c.call(ctx, api.RouteHistory, nil, nil, &out, namespace, name)
	return out.Items, err
}

// RolloutUndo rolls a Deployment back to revision to (0: the previous
// one).
func (c *Client) RolloutUndo(ctx context.Context, namespace, name string, to int64) (api.ApplyResult, error) {
	var out api.ApplyResult
	err := c.call(ctx, api.RouteUndo, nil, api.UndoRequest{ToRevision: to}, &out, namespace, name)
	return out, err
}

// RolloutAction is restart, pause or resume of a Deployment's rollout
// (route api.RouteRestart, RoutePause or RouteResume).
func (c *Client) RolloutAction(ctx context.Context, r api.Route, namespace, name string) (api.ApplyResult, error) {
	var out api.ApplyResult
	err := c.call(ctx, r, nil, struct{}{}, &out, namespace, name)
	return out, err
}

// Metrics returns the agent's metrics in Prometheus' text format.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	resp, err := c.Request(ctx, api.RouteMetrics, nil, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return string(b), err
}

// Join asks a member, on its peer port, to admit this node with a join
// token; an admitted node gets the cluster's credentials.
func (c *Client) Join(ctx context.Context, req api.JoinRequest) (api.JoinAnswer, error) {
	var out api.JoinAnswer
	err := c.call(ctx, api.RouteJoin, nil, req, &out)
	return out, err
}

// Keys returns a peer's gossip keyring, the key in use first.
func (c *Client) Keys(ctx context.Context) ([][]byte, error) {
	var out api.KeyList
	err := c.call(ctx, api.RouteKeys, nil, nil, &out)
	return out.Keys, err
}

// KeyOp installs, uses or removes a gossip key on a peer.
func (c *Client) KeyOp(ctx context.Context, op api.KeyOp) error {
	return c.call(ctx, api.RouteKeyOp, nil, op, nil)
}
