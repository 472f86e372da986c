package cli

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
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/node"
	"github.com/starling-orchestrator/starling/node/api"
)

// Client calls one agent's API, over its unix socket or over HTTP(S).
type Client struct {
	base  string
	token string
	http  *http.Client
}

// NewClient returns a client for server: a unix socket path, or an
// "https://host:port" (or, for an --insecure cluster, "http://host:port")
// URL. token is sent as a bearer token when set. An https server's
// certificate must chain to the CA pinned by caPin and carry the node key
// pinned by serverPin (node.PinnedTLS), so https needs both pins: the
// client config ('starling config') holds them.
func NewClient(server, token, caPin, serverPin string) (*Client, error) {
	switch {
	case strings.HasPrefix(server, "https://"):
		if caPin == "" || serverPin == "" {
			return nil, fmt.Errorf("--server %s: the CLI checks the agent's certificate against the cluster CA and the node's key, and has no pins: write a client config with 'starling config' on that node and use it (--config or STARLING_CONFIG)", server)
		}
		tr := &http.Transport{TLSClientConfig: node.PinnedTLS(caPin, serverPin)}
		return &Client{base: strings.TrimRight(server, "/"), token: token, http: &http.Client{Transport: tr}}, nil
	case strings.HasPrefix(server, "http://"):
		return &Client{base: strings.TrimRight(server, "/"), token: token, http: &http.Client{}}, nil
	case server == "":
		return nil, errors.New("--server: empty; give a unix socket path or http://host:port")
	case !strings.Contains(server, "/") && strings.Contains(server, ":"):
		return nil, fmt.Errorf("--server %s: for a TCP API write https://%s; a unix socket is a path", server, server)
	default:
		path := strings.TrimPrefix(server, "unix://")
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}
		return &Client{base: "http://starling", token: token, http: &http.Client{Transport: tr}}, nil
	}
}

// do sends a request and decodes a JSON answer into out (when non-nil).
// A non-2xx answer becomes an error carrying the agent's message.
func (c *Client) do(ctx context.Context, method, path string, body io.Reader, contentType string, out any) error {
	resp, err := c.raw(ctx, method, path, body, contentType)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// raw sends a request and returns the response when it is 2xx.
func (c *Client) raw(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		err = unwrapURL(err)
		var cv *tls.CertificateVerificationError
		if errors.Is(err, node.ErrPinMismatch) || errors.As(err, &cv) || strings.Contains(err.Error(), "tls: ") {
			return nil, fmt.Errorf("the agent at %s is not the one the client config names: %w", c.base, err)
		}
		return nil, fmt.Errorf("cannot reach the agent: %w (is 'starling agent' running? set --server or STARLING_SERVER, or use a client config: --config)", err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var e api.Error
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			if resp.StatusCode == http.StatusUnauthorized && c.token != "" {
				return nil, fmt.Errorf("%s (the token sent was refused: check --token, STARLING_TOKEN or the client config's token; 'starling config' on a node writes a fresh config)", e.Error)
			}
			return nil, errors.New(e.Error)
		}
		return nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	return resp, nil
}

func unwrapURL(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}

func (c *Client) getJSON(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodGet, path, nil, "", out)
}

func (c *Client) postJSON(ctx context.Context, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, path, bytes.NewReader(b), "application/json", out)
}

// defaultTimeout bounds every CLI call except log streaming and imports.
const defaultTimeout = 60 * time.Second
