package ingress

import (
	"cmp"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/starling-orchestrator/starling/node/view"
	"github.com/starling-orchestrator/starling/placement"
)

// SystemNamespace holds what the cluster keeps for its Ingresses: the
// ACME account key (a Secret) and the HTTP-01 challenges under way,
// one ConfigMap each, which every node's proxy answers from.
const SystemNamespace = "starling-system"

// RenewBefore is how long before its end a certificate is renewed (a
// third of Let's Encrypt's 90 days, as certbot and cert-manager do); a
// shorter-lived certificate is renewed when a third of its life is
// left, and none sooner than MinReissue after it was issued (so a CA
// that issues certificates already due cannot make a loop of orders).
const (
	RenewBefore = 30 * 24 * time.Hour
	MinReissue  = time.Hour
)

// Labels a node publishes (the agent adds them to its labels) so that
// peers know which nodes serve Ingresses over HTTP, on which port
// (HTTPPortLabel), and which issue ACME certificates, from which
// directory (ACMELabel: a hash of its URL): only those own
// certificates and are asked for challenges.
const (
	HTTPPortLabel = "starling.dev/ingress-http-port"
	ACMELabel     = "starling.dev/acme-directory"
)

// IssuedByAnnotation on a Secret names the ACME directory that issued
// its certificate: the issuer writes only Secrets that carry it (or do
// not exist), and orders again when the directory changed.
const IssuedByAnnotation = "starling.dev/issued-by"

// NodeLabels is labels with HTTPPortLabel and ACMELabel added as a
// node serving Ingresses on httpAddr (":80"; "" none) with ACME
// directory ("" none) publishes them.
func NodeLabels(labels map[string]string, httpAddr, directory string) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = map[string]string{}
	}
	if _, port, err := net.SplitHostPort(httpAddr); httpAddr != "" && err == nil {
		out[HTTPPortLabel] = port
	}
	if directory != "" {
		out[ACMELabel] = directoryHash(directory)
	}
	return out
}

func directoryHash(directory string) string {
	sum := sha256.Sum256([]byte(strings.TrimSpace(directory)))
	return hex.EncodeToString(sum[:8])
}

// issuerNodes are the live nodes that issue certificates from
// directory (their ACMELabel), sorted.
func issuerNodes(v *view.View, directory string) []string {
	want := directoryHash(directory)
	var out []string
	for name, st := range v.Statuses {
		if v.Alive[name] && st.Labels[ACMELabel] == want {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// rankFirst is the first of nodes in rendezvous order for key ("": none).
func rankFirst(nodes []string, key string) string {
	pn := make([]placement.Node, 0, len(nodes))
	for _, n := range nodes {
		pn = append(pn, placement.Node{Name: n, Weight: 1})
	}
	if rank := placement.Rank(pn, key, 0); len(rank) > 0 {
		return rank[0]
	}
	return ""
}

// Want is a certificate an Ingress asks ACME for: one spec.tls entry of
// an Ingress annotated for it, stored in Secret Namespace/Secret.
type Want struct {
	Namespace, Secret string
	Hosts             []string // sorted, unique
	// Owner is the node that issues and renews it: the first of
	// rendezvous hashing's order over the live nodes for its key, so
	// every node names the same one without asking (Thaler &
	// Ravishankar 1998, placement.Rank).
	Owner string
	// Why it is due ("" when the stored certificate is good).
	Why string
}

// Key is the Secret's "namespace/name".
func (w Want) Key() string { return w.Namespace + "/" + w.Secret }

// CertsDue is what ACME certificates the Ingresses want, each with its
// owner among nodes and why it is due (none stored, not covering the
// hosts, ending within RenewBefore) as of now. stored returns a Secret's
// data. Two Ingresses asking for one Secret with different hosts ask for
// the union. Pure: values in, values out.
func CertsDue(ings []Ingress, stored func(namespace, name string) (map[string][]byte, bool), nodes []string, now time.Time) []Want {
	byKey := map[string]*Want{}
	for _, ing := range ings {
		if !ing.ACME {
			continue
		}
		for _, t := range ing.TLS {
			hosts := t.Hosts
			if len(hosts) == 0 {
				for _, r := range ing.Rules {
					// A wildcard needs DNS-01 (refused at apply; left
					// out here too, so it never fails the others' order).
					if r.Host != "" && !strings.HasPrefix(r.Host, "*.") {
						hosts = append(hosts, r.Host)
					}
				}
			}
			if len(hosts) == 0 {
				continue
			}
			w, ok := byKey[ing.Namespace+"/"+t.Secret]
			if !ok {
				w = &Want{Namespace: ing.Namespace, Secret: t.Secret}
				byKey[w.Key()] = w
			}
			w.Hosts = append(w.Hosts, hosts...)
		}
	}
	var out []Want
	for _, w := range byKey {
		slices.Sort(w.Hosts)
		w.Hosts = slices.Compact(w.Hosts)
		w.Owner = rankFirst(nodes, "acme/"+w.Key())
		data, _ := stored(w.Namespace, w.Secret)
		w.Why = due(data, w.Hosts, now)
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b Want) int { return cmp.Compare(a.Key(), b.Key()) })
	return out
}

// due says why a stored certificate (a Secret's data) must be issued
// again for hosts, or "" when it need not.
func due(data map[string][]byte, hosts []string, now time.Time) string {
	block, _ := pem.Decode(data["tls.crt"])
	if block == nil || len(data["tls.key"]) == 0 {
		return "no certificate stored"
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "the stored certificate does not parse"
	}
	for _, h := range hosts {
		if leaf.VerifyHostname(h) != nil {
			return fmt.Sprintf("the stored certificate does not cover %s", h)
		}
	}
	if now.Sub(leaf.NotBefore) < MinReissue {
		return "" // just issued: whatever its life, not ordered again yet
	}
	renew := min(RenewBefore, leaf.NotAfter.Sub(leaf.NotBefore)/3)
	if left := leaf.NotAfter.Sub(now); left < renew {
		return fmt.Sprintf("the certificate ends in %s", left.Round(time.Minute))
	}
	return ""
}

// ChallengeName is the ConfigMap (in SystemNamespace) that holds the
// key authorization of HTTP-01 challenge token: a name made from the
// token, which may hold characters a name may not.
func ChallengeName(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "acme-http01-" + hex.EncodeToString(sum[:10])
}

// AccountName is the Secret (in SystemNamespace) holding the ACME
// account key for directory.
func AccountName(directory string) string {
	sum := sha256.Sum256([]byte(strings.TrimSpace(directory)))
	return "acme-account-" + hex.EncodeToString(sum[:6])
}
