package ingress

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/acme"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/manifest"
	"github.com/starling-orchestrator/starling/node/view"
)

// Objects stores and deletes API objects as the API does (validated,
// gossiped): the issuer's certificates, account key and challenges.
type Objects interface {
	Apply(objs []manifest.Object) ([]api.ApplyResult, error)
	Delete(kind, namespace, name string) (api.ApplyResult, error)
	Get(kind, namespace, name string) (api.Object, error)
	List(kind string) ([]api.Object, error)
}

// ACMEConfig is what the issuer needs besides the controller's Config.
type ACMEConfig struct {
	// Self is this node's name: it issues the certificates it owns.
	Self string
	// Directory is the ACME server's directory URL (Let's Encrypt's
	// by default); Email the account's contact ("" for none).
	Directory, Email string
	// RootsFile holds PEM certificates the ACME server's HTTPS is
	// verified with, besides the system's ("": the system's only).
	RootsFile string
}

// issuer gets and renews the certificates Ingresses ask ACME for: each
// one by its owner only (CertsDue), so the cluster orders it once; the
// certificate and the account key are Secrets every node reads.
type issuer struct {
	cfg     ACMEConfig
	views   Views
	objects Objects
	log     *slog.Logger
	// retry is when a certificate that failed may be tried again.
	retry   map[string]time.Time
	backoff map[string]time.Duration
	swept   time.Time
}

// otherDirectory says why w's stored certificate, good by its data,
// is due all the same: it came from another ACME directory than the
// configured one (staging switched to production).
func (is *issuer) otherDirectory(w Want) string {
	if by, ok, err := is.issuedBy(w.Namespace, w.Secret); err == nil && ok && by != is.cfg.Directory {
		return "issued by another ACME directory (" + by + ")"
	}
	return ""
}

// mayWrite reports whether the issuer may write Secret ns/name: it does
// not exist, or the issuer made it (IssuedByAnnotation). A Secret a
// user made is never replaced.
func (is *issuer) mayWrite(ns, name string) error {
	_, ours, err := is.issuedBy(ns, name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !ours {
		return fmt.Errorf("Secret %s/%s exists and was not made by ACME: name another secretName, or delete it", ns, name)
	}
	return nil
}

// issuedBy is the directory Secret ns/name's IssuedByAnnotation names,
// and whether it has that annotation; the error of a Secret that
// cannot be read (a not-found error when there is none).
func (is *issuer) issuedBy(ns, name string) (string, bool, error) {
	o, err := is.objects.Get(manifest.KindSecret, ns, name)
	if err != nil {
		return "", false, err
	}
	var meta struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(o.Object, &meta); err != nil {
		return "", false, fmt.Errorf("Secret %s/%s: %w", ns, name, err)
	}
	by, ok := meta.Metadata.Annotations[IssuedByAnnotation]
	return by, ok, nil
}

// issuerCheckEvery is how often the issuer looks at the certificates
// when no view changes (renewals come due with time alone).
const issuerCheckEvery = time.Hour

// issuerGap is the least time between two passes of the issuer (views
// change several times a second while replicas move).
const issuerGap = 2 * time.Second

// run issues what is due and owned, on view changes (at most one pass
// every issuerGap) and every issuerCheckEvery, at most one certificate
// at a time, until ctx ends.
func (is *issuer) run(ctx context.Context) {
	tick := time.NewTicker(issuerCheckEvery)
	defer tick.Stop()
	for {
		changed := is.views.Changed()
		if v := is.views.View(); v.Synced {
			is.pass(ctx, v)
			is.sweep(v)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(issuerGap):
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
		}
	}
}

// sweep deletes the challenges left behind by an order cut short (its
// owner died or restarted mid-order) an hour after they were made: the
// owner of key "acme/challenges" does, once an hour at most.
func (is *issuer) sweep(v *view.View) {
	if time.Since(is.swept) < time.Hour || rankFirst(issuerNodes(v, is.cfg.Directory), "acme/challenges") != is.cfg.Self {
		return
	}
	is.swept = time.Now()
	items, err := is.objects.List(manifest.KindConfigMap)
	if err != nil {
		return
	}
	for _, it := range items {
		o, err := manifest.Decode(it.Object)
		if err != nil || o.Namespace != SystemNamespace || !strings.HasPrefix(o.Name, "acme-http01-") {
			continue
		}
		if made, err := time.Parse(time.RFC3339, o.ConfigMap.Data["made"]); err != nil || time.Since(made) > time.Hour {
			_, _ = is.objects.Delete(manifest.KindConfigMap, SystemNamespace, o.Name)
		}
	}
}

// pass issues the first certificate due that this node owns.
func (is *issuer) pass(ctx context.Context, v *view.View) {
	var ings []Ingress
	for _, o := range v.Ingresses {
		ings = append(ings, ingressOf(o.Ingress))
	}
	now := time.Now()
	for _, w := range CertsDue(ings, v.Config.Secret, issuerNodes(v, is.cfg.Directory), now) {
		if w.Owner != is.cfg.Self || now.Before(is.retry[w.Key()]) {
			continue
		}
		if w.Why == "" {
			w.Why = is.otherDirectory(w)
		}
		if w.Why == "" {
			continue
		}
		is.log.Info("acme: ordering a certificate", "secret", w.Key(), "hosts", w.Hosts, "why", w.Why, "directory", is.cfg.Directory)
		start := time.Now()
		err := is.issue(ctx, v, w)
		if err != nil {
			b := min(max(2*is.backoff[w.Key()], time.Minute), time.Hour)
			is.backoff[w.Key()], is.retry[w.Key()] = b, time.Now().Add(b)
			is.log.Warn("acme: no certificate; trying again later", "secret", w.Key(), "hosts", w.Hosts, "in", b, "err", api.OneLine(err.Error()))
			return
		}
		delete(is.backoff, w.Key())
		delete(is.retry, w.Key())
		is.log.Info("acme: certificate stored", "secret", w.Key(), "hosts", w.Hosts, "took", time.Since(start).Round(time.Millisecond))
		return // the next pass, on the view with the new Secret
	}
}

// issue orders w's certificate (RFC 8555: account, order, HTTP-01
// authorizations answered by every node, finalize) and stores it.
func (is *issuer) issue(ctx context.Context, v *view.View, w Want) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := is.mayWrite(w.Namespace, w.Secret); err != nil {
		return err
	}
	client, err := is.client(ctx, v)
	if err != nil {
		return err
	}
	order, err := client.AuthorizeOrder(ctx, acme.DomainIDs(w.Hosts...))
	if err != nil {
		return fmt.Errorf("new order: %w", err)
	}
	var published []string
	defer func() {
		for _, name := range published {
			_, _ = is.objects.Delete(manifest.KindConfigMap, SystemNamespace, name)
		}
	}()
	for _, u := range order.AuthzURLs {
		z, err := client.GetAuthorization(ctx, u)
		if err != nil {
			return fmt.Errorf("authorization: %w", err)
		}
		if z.Status == acme.StatusValid {
			continue
		}
		var chal *acme.Challenge
		for _, c := range z.Challenges {
			if c.Type == "http-01" {
				chal = c
			}
		}
		if chal == nil {
			return fmt.Errorf("the ACME server offers no http-01 challenge for %s", z.Identifier.Value)
		}
		ka, err := client.HTTP01ChallengeResponse(chal.Token)
		if err != nil {
			return err
		}
		name := ChallengeName(chal.Token)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: SystemNamespace},
			Data: map[string]string{"token": chal.Token, "keyAuthorization": ka, "host": z.Identifier.Value, "made": time.Now().UTC().Format(time.RFC3339)}}
		if _, err := is.objects.Apply([]manifest.Object{{Kind: manifest.KindConfigMap, Namespace: SystemNamespace, Name: name, ConfigMap: cm}}); err != nil {
			return fmt.Errorf("publish the challenge: %w", err)
		}
		published = append(published, name)
		if err := is.servedEverywhere(ctx, z.Identifier.Value, chal.Token, ka); err != nil {
			return err
		}
		if _, err := client.Accept(ctx, chal); err != nil {
			return fmt.Errorf("accept the challenge: %w", err)
		}
		if _, err := client.WaitAuthorization(ctx, z.URI); err != nil {
			return fmt.Errorf("authorization of %s: %w", z.Identifier.Value, err)
		}
	}
	// The order's URL and finalize URL are those it was made with: a
	// poll's answer has no Location to take the URL from.
	uri, finalize := order.URI, order.FinalizeURL
	if order, err = client.WaitOrder(ctx, uri); err != nil {
		return fmt.Errorf("order: %w", err)
	}
	order.URI = uri
	if order.FinalizeURL == "" {
		order.FinalizeURL = finalize
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: w.Hosts}, key)
	if err != nil {
		return err
	}
	chain, _, err := client.CreateCertFromOrder(ctx, order, csr, true)
	if err != nil {
		return fmt.Errorf("finalize: %w", err)
	}
	var crt []byte
	for _, der := range chain {
		crt = append(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: w.Secret, Namespace: w.Namespace,
		Annotations: map[string]string{IssuedByAnnotation: is.cfg.Directory}}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})}}
	// Asked again: a user may have made the Secret while the order was
	// under way.
	if err := is.mayWrite(w.Namespace, w.Secret); err != nil {
		return err
	}
	if _, err := is.objects.Apply([]manifest.Object{{Kind: manifest.KindSecret, Namespace: w.Namespace, Name: w.Secret, Secret: sec}}); err != nil {
		return fmt.Errorf("store the certificate: %w", err)
	}
	return nil
}

// client is an ACME client with the cluster's account for the
// directory: its key from the account Secret, made and stored (then
// registered) when there is none.
func (is *issuer) client(ctx context.Context, v *view.View) (*acme.Client, error) {
	roots, err := LoadRoots(is.cfg.RootsFile)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, Proxy: http.ProxyFromEnvironment}}
	name := AccountName(is.cfg.Directory)
	var key crypto.Signer
	if data, ok := v.Config.Secret(SystemNamespace, name); ok {
		k, err := parseKey(data["account.key"])
		if err != nil {
			// Never replaced: it may be the key of an account in use.
			return nil, fmt.Errorf("the ACME account key in Secret %s/%s: %w", SystemNamespace, name, err)
		}
		key = k
	}
	if key == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, err
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: SystemNamespace, Annotations: map[string]string{"starling.dev/acme-directory": is.cfg.Directory}},
			Data: map[string][]byte{"account.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})}}
		if _, err := is.objects.Apply([]manifest.Object{{Kind: manifest.KindSecret, Namespace: SystemNamespace, Name: name, Secret: sec}}); err != nil {
			return nil, fmt.Errorf("store the ACME account key: %w", err)
		}
		key = k
	}
	c := &acme.Client{Key: key, DirectoryURL: is.cfg.Directory, HTTPClient: hc, UserAgent: "starling"}
	acct := &acme.Account{}
	if is.cfg.Email != "" {
		acct.Contact = []string{"mailto:" + is.cfg.Email}
	}
	if _, err := c.Register(ctx, acct, acme.AcceptTOS); err != nil && !errors.Is(err, acme.ErrAccountAlreadyExists) {
		return nil, fmt.Errorf("ACME account at %s: %w", is.cfg.Directory, err)
	}
	return c, nil
}

// parseKey reads a PEM private key: SEC 1 (EC), PKCS #8 or PKCS #1 (RSA).
func parseKey(b []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("account.key holds no PEM block")
	}
	if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("account.key is no EC, PKCS #1 or PKCS #8 private key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("account.key holds a %T, not a signing key", k)
	}
	return signer, nil
}

// LoadRoots is the system's certificate pool with the PEM certificates
// of file added ("": the system's alone).
func LoadRoots(file string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if file == "" {
		return pool, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--acme-ca: %w", err)
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--acme-ca %s: no PEM certificate in it", file)
	}
	return pool, nil
}

// servedEverywhere waits until every live node's proxy answers the
// challenge token with ka for host, so the ACME server finds it on
// whichever node the host's name leads to (up to 30 s: the ConfigMap
// reaches every node by gossip in about a second).
func (is *issuer) servedEverywhere(ctx context.Context, host, token, ka string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: 3 * time.Second}
	for {
		v := is.views.View()
		var missing []string
		for name, st := range v.Statuses {
			ip := st.HostIP()
			port, err := strconv.Atoi(st.Labels[HTTPPortLabel])
			if !v.Alive[name] || ip == "" || err != nil || port < 1 || port > 65535 {
				continue // a node that serves no Ingress over HTTP is not where a name leads
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(ip, strconv.Itoa(port))+challengePath+token, nil)
			req.Host = host
			resp, err := hc.Do(req)
			ok := false
			if err == nil {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				ok = resp.StatusCode == 200 && string(b) == ka
			}
			if !ok {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		slices.Sort(missing)
		select {
		case <-ctx.Done():
			return fmt.Errorf("the HTTP-01 challenge for %s is not served by %s", host, strings.Join(missing, ", "))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
