package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/starling-orchestrator/starling/node"
	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// ingressFlags are the agent's flags of the node's Ingress proxy
// (node/ingress).
func ingressFlags(f *pflag.FlagSet, cfg *node.Config) {
	f.StringVar(&cfg.IngressHTTP, "ingress-http", cfg.IngressHTTP, `where the node serves Ingresses over HTTP (HOST:PORT or :PORT; "" for nowhere)`)
	f.StringVar(&cfg.IngressHTTPS, "ingress-https", cfg.IngressHTTPS, `where the node serves Ingresses over HTTPS, certificates chosen by SNI (HOST:PORT or :PORT; "" for nowhere)`)
	f.StringVar(&cfg.ACMEDirectory, "acme-directory", cfg.ACMEDirectory, `the ACME server that issues the certificates of Ingresses annotated kubernetes.io/tls-acme: "true" (or cert-manager.io/cluster-issuer); "" for none`)
	f.StringVar(&cfg.ACMEEmail, "acme-email", cfg.ACMEEmail, "the contact of the cluster's ACME account (expiry notices)")
	f.StringVar(&cfg.ACMECA, "acme-ca", cfg.ACMECA, "a PEM file of CA certificates the ACME server's HTTPS is verified with, besides the system's (a private ACME server)")
}

// ingressesOf decodes the Ingresses of a list as the API serves them
// (status and the backends annotation included, which manifest.Decode
// clears) in namespace ns (all with allNamespaces), named name ("": any).
func ingressesOf(cmd *cobra.Command, items []api.Object, o getOpts, ns, name string) []*networkingv1.Ingress {
	var out []*networkingv1.Ingress
	for _, it := range items {
		var in networkingv1.Ingress
		if err := json.Unmarshal(it.Object, &in); err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "warning: skipped a stored Ingress that does not decode (written by node %s): %v\n", it.Origin, err)
			continue
		}
		if o.wants(in.Namespace, ns) && (name == "" || in.Name == name) {
			out = append(out, &in)
		}
	}
	return out
}

// getIngresses is 'get ingress': kubectl's columns (NAME, CLASS, HOSTS,
// ADDRESS, PORTS, AGE).
func getIngresses(g *globals, cmd *cobra.Command, c *client.Client, o getOpts, name string) error {
	ctx, cancel := timeoutCtx(cmd)
	defer cancel()
	items, err := c.List(ctx, "ingress")
	if err != nil {
		return err
	}
	ings := ingressesOf(cmd, items, o, g.namespace, name)
	if name != "" && len(ings) == 0 {
		return fmt.Errorf("ingress %q not found in namespace %q", name, g.namespace)
	}
	if name != "" && (o.output == "json" || o.output == "yaml") {
		_, err := structured(g.stdout, o.output, ings[0])
		return err
	}
	if ok, err := structured(g.stdout, o.output, map[string]any{"apiVersion": "v1", "kind": "List", "items": ings}); ok {
		return err
	}
	t := newTable(g.stdout, o.cells("NAMESPACE", []string{"NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"})...)
	for _, in := range ings {
		class := "<none>"
		if in.Spec.IngressClassName != nil {
			class = *in.Spec.IngressClassName
		}
		ports := "80"
		if len(in.Spec.TLS) > 0 {
			ports = "80, 443"
		}
		t.row(o.cells(in.Namespace, []string{in.Name, class, ingressHosts(in), ingressAddress(in), ports, age(in.CreationTimestamp.Time)})...)
	}
	return t.flush()
}

func ingressHosts(in *networkingv1.Ingress) string {
	var hosts []string
	for _, r := range in.Spec.Rules {
		h := r.Host
		if h == "" {
			h = "*"
		}
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	if len(hosts) == 0 {
		return "*"
	}
	return strings.Join(hosts, ",")
}

func ingressAddress(in *networkingv1.Ingress) string {
	var addrs []string
	for _, a := range in.Status.LoadBalancer.Ingress {
		addrs = append(addrs, a.IP)
	}
	return strings.Join(addrs, ",")
}

// describeIngress prints an Ingress as kubectl describe does: its
// addresses, TLS, and each rule's backends with their ready endpoints
// as the answering node routes to them.
func describeIngress(w io.Writer, cmd *cobra.Command, obj api.Object) error {
	ings := ingressesOf(cmd, []api.Object{obj}, getOpts{allNamespaces: true}, "", "")
	if len(ings) == 0 {
		return fmt.Errorf("the Ingress does not decode")
	}
	in := ings[0]
	var backends map[string][]string
	_ = json.Unmarshal([]byte(in.Annotations[manifest.BackendsAnnotation]), &backends)
	p := func(k, v string) { fmt.Fprintf(w, "%-18s %s\n", k+":", v) }
	backend := func(b *networkingv1.IngressServiceBackend) string {
		port := b.Port.Name
		if port == "" {
			port = fmt.Sprint(b.Port.Number)
		}
		key := b.Name + ":" + port
		eps, ok := backends[key]
		switch {
		case !ok:
			return key + " (<unknown>)"
		case len(eps) == 1 && strings.HasPrefix(eps[0], "<"):
			return key + " (" + eps[0] + ")"
		case len(eps) == 0:
			return key + " (<no ready endpoint>)"
		}
		return key + " (" + strings.Join(eps, ",") + ")"
	}
	p("Name", in.Name)
	p("Namespace", in.Namespace)
	p("Address", ingressAddress(in))
	class := "<none>"
	if in.Spec.IngressClassName != nil {
		class = *in.Spec.IngressClassName
	}
	p("Ingress Class", class)
	def := "<none> (a request no rule matches gets 404)"
	if in.Spec.DefaultBackend != nil && in.Spec.DefaultBackend.Service != nil {
		def = backend(in.Spec.DefaultBackend.Service)
	}
	p("Default backend", def)
	if len(in.Spec.TLS) > 0 {
		var certs map[string]string
		_ = json.Unmarshal([]byte(in.Annotations[manifest.CertificatesAnnotation]), &certs)
		fmt.Fprintln(w, "TLS:")
		for _, t := range in.Spec.TLS {
			hosts := strings.Join(t.Hosts, ",")
			if hosts == "" {
				hosts = "every host of its rules"
			}
			fmt.Fprintf(w, "  %s terminates %s\n", t.SecretName, hosts)
			if c, ok := certs[t.SecretName]; ok {
				fmt.Fprintf(w, "    certificate: %s\n", c)
			}
		}
		if manifest.WantsACME(in) {
			fmt.Fprintln(w, "  (certificates issued by the cluster's ACME server)")
		}
	}
	fmt.Fprintln(w, "Rules:")
	t := newTable(w, "  Host", "Path", "Backends")
	t.row("  ----", "----", "--------")
	for _, r := range in.Spec.Rules {
		host := r.Host
		if host == "" {
			host = "*"
		}
		t.row("  "+host, "", "")
		if r.HTTP == nil {
			continue
		}
		for _, hp := range r.HTTP.Paths {
			if hp.Backend.Service != nil {
				t.row("  ", hp.Path, backend(hp.Backend.Service))
			}
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	var notes []string
	for k, v := range in.Annotations {
		if k != manifest.BackendsAnnotation && k != manifest.CertificatesAnnotation && k != "kubectl.kubernetes.io/last-applied-configuration" {
			notes = append(notes, k+": "+v)
		}
	}
	slices.Sort(notes)
	p("Annotations", orNone(strings.Join(notes, "\n                   ")))
	return nil
}
