// Package client is the typed Go client of the agent's API (node/api):
// the CLI, node-to-node calls and the test harness all use it. Every
// request is built from the route table (api.Route), and every failed
// request comes back as an *apierrors.StatusError
// (k8s.io/apimachinery/pkg/api/errors), so callers test
// apierrors.IsNotFound, IsConflict, IsInvalid or IsUnauthorized rather
// than matching messages; the message is the agent's, unchanged.
//
// A request that never reached the agent (refused, timed out, a TLS
// failure) is a *TransportError.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/node/api"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Client calls one agent's API, over its unix socket or over HTTP(S).
// It is safe for concurrent use.
type Client struct {
	base  string
	token string
	hc    *http.Client
	// maxError bounds the error body read, in bytes.
	maxError int64
}

// Option configures a Client (New).
type Option func(*options)

type options struct {
	token     string
	tls       *tls.Config
	caPin     string
	serverPin string
	timeout   time.Duration
	transport http.RoundTripper
}

// WithToken sends token as a bearer token with every request.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithPins accepts an https server only if its certificate chains to the
// CA whose SubjectPublicKeyInfo hashes to the CA pin and carries the node key
// whose SubjectPublicKeyInfo hashes to serverPin (SHA-256, hex; see
// PinnedTLS). An https server needs pins or WithTLS.
func WithPins(caPin, serverPin string) Option {
	return func(o *options) { o.caPin, o.serverPin = caPin, serverPin }
}

// WithTLS uses cfg for an https server (node-to-node calls: mutual TLS
// with node certificates).
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithTimeout bounds each whole request, body included (0: no bound;
// the default, since logs and images stream).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithTransport sends requests through rt (tests; a dial function
// inside a network namespace). It replaces the unix socket and TLS
// set-up: rt must reach the server.
func WithTransport(rt http.RoundTripper) Option { return func(o *options) { o.transport = rt } }

// New returns a client of server: a unix socket path (optionally
// "unix://PATH"), or an "https://host:port" URL ("http://host:port" for
// an --insecure cluster).
func New(server string, opts ...Option) (*Client, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	c := &Client{token: o.token, maxError: 1 << 20}
	var tr http.RoundTripper
	switch {
	case strings.HasPrefix(server, "https://"):
		cfg := o.tls
		if cfg == nil && o.transport == nil {
			if o.caPin == "" || o.serverPin == "" {
				return nil, fmt.Errorf("--server %s: the CLI checks the agent's certificate against the cluster CA and the node's key, and has no pins: write a client config with 'starling config' on that node and use it (--config or STARLING_CONFIG)", server)
			}
			cfg = PinnedTLS(o.caPin, o.serverPin)
		}
		c.base = strings.TrimRight(server, "/")
		tr = &http.Transport{TLSClientConfig: cfg, DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
			ResponseHeaderTimeout: 30 * time.Second, IdleConnTimeout: 90 * time.Second}
	case strings.HasPrefix(server, "http://"):
		c.base = strings.TrimRight(server, "/")
		tr = &http.Transport{DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext, IdleConnTimeout: 90 * time.Second}
	case server == "":
		return nil, errors.New("--server: empty; give a unix socket path or https://host:port")
	case !strings.Contains(server, "/") && strings.Contains(server, ":"):
		return nil, fmt.Errorf("--server %s: for a TCP API write https://%s; a unix socket is a path", server, server)
	default:
		path := strings.TrimPrefix(server, "unix://")
		c.base = "http://starling"
		tr = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}
	}
	if o.transport != nil {
		tr = o.transport
	}
	c.hc = &http.Client{Transport: tr, Timeout: o.timeout}
	return c, nil
}

// Base is the URL requests go to ("http://starling" for a unix socket).
func (c *Client) Base() string { return c.base }

// Token is the bearer token sent with every request ("": none).
func (c *Client) Token() string { return c.token }

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// TransportError is a request that got no answer from the agent: it was
// not reachable, the connection broke, or its certificate was refused
// (Pin is then set).
type TransportError struct {
	Base string
	Err  error
	Pin  bool // the server is not the one the pins name
}

func (e *TransportError) Error() string {
	if e.Pin {
		return fmt.Sprintf("the agent at %s is not the one the client config names: %v", e.Base, e.Err)
	}
	// No hint here: the client is also how nodes call each other, and a
	// hint for a CLI user ended up in agents' logs; the CLI adds it
	// (cli.withHint).
	return fmt.Sprintf("cannot reach %s: %v", e.Base, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// Request sends one request on route r (its {segments} filled by args)
// with query q (nil: none) and body (nil: none; a JSON body when not an
// io.Reader), and returns the response when it is 2xx; the caller closes
// its body. Any other answer is an *apierrors.StatusError.
func (c *Client) Request(ctx context.Context, r api.Route, q url.Values, body any, args ...string) (*http.Response, error) {
	u := c.base + r.Path(args...)
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	contentType := ""
	switch b := body.(type) {
	case nil:
	case Stream:
		rd, contentType = b.Body, b.ContentType
	case io.Reader:
		rd, contentType = b, "application/octet-stream"
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			return nil, fmt.Errorf("%s: encode request: %w", r, err)
		}
		rd, contentType = bytes.NewReader(enc), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, u, rd)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		err = unwrapURL(err)
		var cv *tls.CertificateVerificationError
		pin := errors.Is(err, ErrPinMismatch) || errors.Is(err, ErrServerPin) || errors.As(err, &cv) || strings.Contains(err.Error(), "tls: ")
		return nil, &TransportError{Base: c.base, Err: err, Pin: pin}
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, c.maxError))
	var e api.Error
	if json.Unmarshal(b, &e) != nil || e.Error == "" && e.Message == "" {
		e = api.Error{Error: fmt.Sprintf("%s %s: %s: %s", r.Method, r.Path(args...), resp.Status, bytes.TrimSpace(b))}
	}
	serr := e.AsError(resp.StatusCode)
	if resp.StatusCode == http.StatusUnauthorized && c.token != "" {
		var se *apierrors.StatusError
		if errors.As(serr, &se) {
			se.ErrStatus.Message += " (the token sent was refused: check --token, STARLING_TOKEN or the client config's token; 'starling config' on a node writes a fresh config)"
		}
	}
	return nil, serr
}

// Stream is a request body sent as it is, with its content type.
type Stream struct {
	Body        io.Reader
	ContentType string
}

// call sends a request and decodes a JSON answer into out (when not nil).
func (c *Client) call(ctx context.Context, r api.Route, q url.Values, in, out any, args ...string) error {
	resp, err := c.Request(ctx, r, q, in, args...)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s: decode answer: %w", r, err)
	}
	return nil
}

func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err
	}
	return err
}

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
// "service", "configmap", "secret", or a kind alias); Secrets without
// their values (api.Object.DataSizes).
func (c *Client) List(ctx context.Context, kind string) ([]api.Object, error) {
	var out api.ObjectList
	err := c.call(ctx, api.RouteObjects, nil, nil, &out, strings.ToLower(kind))
	return out.Items, err
}

// Get returns one stored object; apierrors.IsNotFound when there is none.
// A Secret comes without its values (api.Object.DataSizes).
func (c *Client) Get(ctx context.Context, kind, namespace, name string) (api.Object, error) {
	return c.get(ctx, nil, kind, namespace, name)
}

// Reveal returns one stored object, a Secret with its values.
func (c *Client) Reveal(ctx context.Context, kind, namespace, name string) (api.Object, error) {
	return c.get(ctx, url.Values{"reveal": {"true"}}, kind, namespace, name)
}

func (c *Client) get(ctx context.Context, q url.Values, kind, namespace, name string) (api.Object, error) {
	var out api.Object
	err := c.call(ctx, api.RouteObject, q, nil, &out, strings.ToLower(kind), namespace, name)
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

// ReleaseClaim gives up the data of PersistentVolumeClaim
// namespace/name, whose node is gone: the next replica that mounts it
// starts empty on another node.
func (c *Client) ReleaseClaim(ctx context.Context, namespace, name string) (api.ApplyResult, error) {
	var out api.ApplyResult
	err := c.call(ctx, api.RouteRelease, nil, nil, &out, namespace, name)
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

// DNSLookup looks q up as a pod of q.Namespace on the node (or, with
// q.From, replica q.From on its node) would. The answer is read up to
// maxDNSAnswer bytes: a node hands on what a peer answers.
func (c *Client) DNSLookup(ctx context.Context, q api.DNSQuery) (api.DNSAnswer, error) {
	var out api.DNSAnswer
	resp, err := c.Request(ctx, api.RouteDNSLookup, q.Values(), nil)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxDNSAnswer)).Decode(&out); err != nil {
		return out, fmt.Errorf("%s: decode answer: %w", api.RouteDNSLookup, err)
	}
	return out, nil
}

// maxDNSAnswer bounds a DNS lookup's answer (a UDP answer's records are
// a few kB; a TCP one at most 64 kB, as text a few times that).
const maxDNSAnswer = 1 << 20

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
