package ingress

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/starling-orchestrator/starling/node/view"
	"golang.org/x/net/netutil"
)

// Views are the node's views: the latest, and a channel that says a
// newer one is there.
type Views interface {
	View() *view.View
	Changed() <-chan struct{}
}

// Config is what a Controller needs.
type Config struct {
	Views Views
	// HTTPAddr and HTTPSAddr are the listeners' addresses (":80",
	// ":443"); "" serves none on that scheme.
	HTTPAddr, HTTPSAddr string
	// ACME issues the certificates Ingresses ask for (nil: none is
	// issued; such Ingresses are served with what their Secrets hold).
	ACME *ACMEConfig
	Log  *slog.Logger
}

// Controller keeps the proxy's table that of the latest view and
// serves it on the node's HTTP and HTTPS ports.
type Controller struct {
	cfg   Config
	proxy *Proxy
	certs Certs
	// Objects stores the certificates ACME issues (set before Run; nil:
	// none is issued).
	Objects Objects
}

// New returns a controller of cfg.
func New(cfg Config) *Controller {
	p := NewProxy(cfg.Log)
	p.HTTPSPort = 0
	if _, port, err := net.SplitHostPort(cfg.HTTPSAddr); err == nil {
		if n, err := strconv.Atoi(port); err == nil && n > 0 {
			p.HTTPSPort = n
		}
	}
	return &Controller{cfg: cfg, proxy: p}
}

// Proxy is the controller's proxy.
func (c *Controller) Proxy() *Proxy { return c.proxy }

// Run serves until ctx ends: it listens (again every 5 s while a port
// is taken), and builds a table from each new view. Open connections
// are closed when it returns.
func (c *Controller) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, l := range []struct {
		addr   string
		secure bool
	}{{c.cfg.HTTPAddr, false}, {c.cfg.HTTPSAddr, true}} {
		if l.addr == "" {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); c.serve(ctx, l.addr, l.secure) }()
	}
	if c.cfg.ACME != nil && c.Objects != nil {
		is := &issuer{cfg: *c.cfg.ACME, views: c.cfg.Views, objects: c.Objects, log: c.cfg.Log, retry: map[string]time.Time{}, backoff: map[string]time.Duration{}}
		wg.Add(1)
		go func() { defer wg.Done(); is.run(ctx) }()
	}
	var problems string
	for {
		changed := c.cfg.Views.Changed() // before the view: a newer one is never missed
		v := c.cfg.Views.View()
		if !v.Synced {
			// A node that does not hold the cluster's state yet would
			// answer 404 for Ingresses it has not heard of: the empty
			// table stands until it does.
			select {
			case <-ctx.Done():
				wg.Wait()
				return
			case <-changed:
			}
			continue
		}
		t := Build(InputOf(v, &c.certs))
		c.certs.keep(t.secrets)
		c.proxy.Set(t)
		if p := strings.Join(t.Problems, "; "); p != problems {
			problems = p
			if p != "" {
				c.cfg.Log.Warn("ingress: some TLS hosts are served with the default certificate", "problems", p)
			}
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-changed:
		}
	}
}

// serve listens on addr and serves the proxy until ctx ends.
func (c *Controller) serve(ctx context.Context, addr string, secure bool) {
	srv := &http.Server{
		// Requests (and the connections a WebSocket took over) end
		// with ctx.
		BaseContext:       func(net.Listener) context.Context { return ctx },
		Handler:           c.proxy.Handler(secure),
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(c.cfg.Log.Handler(), slog.LevelDebug),
	}
	if secure {
		srv.TLSConfig = c.proxy.TLSConfig()
	}
	var lc net.ListenConfig
	for {
		l, err := lc.Listen(ctx, "tcp", addr)
		if err == nil {
			go func() {
				<-ctx.Done()
				shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = srv.Shutdown(shut)
				_ = srv.Close()
			}()
			c.cfg.Log.Info("ingress: serving", "addr", addr, "tls", secure)
			l = netutil.LimitListener(l, MaxConnections)
			if secure {
				err = srv.ServeTLS(l, "", "") // certificates: TLSConfig.GetCertificate
			} else {
				err = srv.Serve(l)
			}
			if errors.Is(err, http.ErrServerClosed) {
				return
			}
		}
		c.cfg.Log.Warn("ingress: cannot listen; trying again in 5 s", "addr", addr, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}
