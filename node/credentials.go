package node

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/node/trust"
)

// setupCredentials gives a node what it needs to be a member: with
// --insecure, nothing; a node that joined before uses the credentials in
// its data dir; otherwise it joins with --join-token-file (whose
// invitation brings the node's key, replacing key), or, given no --join,
// creates a new cluster. It returns the node key. A node that holds the
// CA key renews its certificate (trust.RenewNodeCert).
func setupCredentials(ctx context.Context, cfg Config, key ed25519.PrivateKey, log *slog.Logger) (*trust.Credentials, ed25519.PrivateKey, error) {
	if cfg.Insecure {
		if _, err := os.Stat(filepath.Join(cfg.DataDir, trust.CaCertFile)); err == nil {
			return nil, nil, fmt.Errorf("--insecure: %s belongs to a secure cluster (it holds %s); start without --insecure", cfg.DataDir, trust.CaCertFile)
		}
		return nil, key, nil
	}
	creds, key, err := setupSecure(ctx, cfg, key, log)
	if err != nil {
		return nil, nil, err
	}
	if cn := creds.NodeCert.Subject.CommonName; cn != cfg.Name {
		return nil, nil, fmt.Errorf("--name %s: this data dir's certificate is for node %q; start with --name %s", cfg.Name, cn, cn)
	}
	if !creds.NodeCert.PublicKey.(ed25519.PublicKey).Equal(key.Public()) {
		return nil, nil, fmt.Errorf("%s: the certificate is not for this node's key (%s); remove %s, %s and %s and join again with a new invitation", trust.NodeCertFile, trust.NodeKeyFile, trust.NodeKeyFile, trust.NodeCertFile, trust.CaCertFile)
	}
	if err := trust.RenewNodeCert(cfg.DataDir, creds, key, advertisedIPs(cfg), time.Now()); err != nil {
		return nil, nil, err
	}
	if creds.CAKey == nil && creds.NodeCert.NotAfter.Before(creds.CA.NotAfter.Add(-trust.NodeCertRenewBefore)) {
		log.Warn("this node's certificate ends long before the CA (a certificate of a build before invitations) and this node holds no CA key to renew it: start it once with ca.key in its data dir (docs/real-hosts.md, Upgrades), or forget it and invite it again, before then",
			"notAfter", creds.NodeCert.NotAfter)
	}
	if creds.CAKey != nil {
		log.Warn("this node's data dir holds the cluster's CA key: whoever takes this node can add nodes to the cluster. Keep it only where you make invitations: move "+trust.CaCertFile+" and "+trust.CaKeyFile+" there (e.g. 'starling ca move-off', docs/real-hosts.md)",
			"file", filepath.Join(cfg.DataDir, trust.CaKeyFile))
	}
	return creds, key, nil
}

// setupSecure is setupCredentials for a secure cluster.
func setupSecure(ctx context.Context, cfg Config, key ed25519.PrivateKey, log *slog.Logger) (*trust.Credentials, ed25519.PrivateKey, error) {
	creds, err := trust.LoadCredentials(cfg.DataDir)
	switch {
	case err == nil:
		if cfg.JoinTokenFile != "" {
			if _, err := os.Stat(cfg.JoinTokenFile); err == nil {
				log.Warn("already a member of the cluster: --join-token-file is not needed; delete the file (it holds this node's key) and drop the flag", "file", cfg.JoinTokenFile)
			}
		}
		return creds, key, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, nil, err
	case cfg.JoinTokenFile != "":
		if len(cfg.Join) == 0 {
			return nil, nil, errors.New("--join-token-file: also give --join with the address of any cluster node")
		}
		_, bindPort, err := trust.SplitHostPort(cfg.BindAddr, 7946)
		if err != nil {
			return nil, nil, fmt.Errorf("--bind %q: %w", cfg.BindAddr, err)
		}
		return trust.JoinWithToken(ctx, cfg.DataDir, cfg.JoinTokenFile, cfg.Name, cfg.Join, bindPort, log)
	case len(cfg.Join) == 0:
		if creds, err = trust.CreateCluster(cfg.DataDir, cfg.DataDir, cfg.Name, key, advertisedIPs(cfg), time.Now()); err != nil {
			return nil, nil, err
		}
		log.Info("created a new cluster (CA, gossip key and this node's certificate in the data dir); invite nodes with 'starling join-token NODE-NAME' on this machine",
			"ca", trust.CaPin(creds.CA)[:16], "dataDir", cfg.DataDir)
		return creds, key, nil
	default:
		return nil, nil, fmt.Errorf("--join %s: joining a cluster needs an invitation: run 'starling join-token %s' where the cluster's CA key is kept (the first node, or where 'starling init' ran), save it to a file (chmod 600) and pass --join-token-file FILE",
			strings.Join(cfg.Join, ","), cfg.Name)
	}
}

// advertisedIPs are the addresses a node's certificate names: its
// --advertise host (else its --bind host), and its --api-listen host,
// wildcards left out.
func advertisedIPs(cfg Config) []netip.Addr {
	parse := func(s string) (netip.Addr, bool) {
		host, _, err := trust.SplitHostPort(s, 0)
		if s == "" || err != nil {
			return netip.Addr{}, false
		}
		ip, err := netip.ParseAddr(host)
		return ip.Unmap(), err == nil && !ip.IsUnspecified()
	}
	var out []netip.Addr
	if ip, ok := parse(cfg.Advertise); ok {
		out = append(out, ip)
	} else if ip, ok := parse(cfg.BindAddr); ok {
		out = append(out, ip)
	}
	if ip, ok := parse(cfg.APIListen); ok && !slices.Contains(out, ip) {
		out = append(out, ip)
	}
	return out
}
