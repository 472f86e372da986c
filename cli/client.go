package cli

import (
	"bytes"
	"context"
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
// certificate must chain to the CA pinned by caPin (node.PinnedTLS), so
// https needs a pin: the client config ('starling config') holds it.
func NewClient(server, token, caPin string) (*Client, error) {
	switch {
	case strings.HasPrefix(server, "https://"):
		if caPin == "" {
			return nil, fmt.Errorf("--server %s: the CLI checks the agent's certificate against the cluster CA, and has no CA pin: write a client config on a node with 'starling config' and use it (--config or STARLING_CONFIG)", server)
		}
		tr := &http.Transport{TLSClientConfig: node.PinnedTLS(caPin)}
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
		return nil, fmt.Errorf("cannot reach the agent: %w (is 'starling agent' running? set --server or STARLING_SERVER)", unwrapURL(err))
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var e api.Error
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
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
