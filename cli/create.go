package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// dataSources are kubectl create's --from-literal, --from-file and
// --from-env-file flags.
type dataSources struct {
	literals, files, envFiles []string
}

func (d *dataSources) flags(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&d.literals, "from-literal", nil, "a key and literal value: KEY=VALUE (repeatable)")
	cmd.Flags().StringArrayVar(&d.files, "from-file", nil, "a file ([KEY=]PATH, the key defaults to the file's name) or a directory (each regular file whose name is a valid key) (repeatable)")
	cmd.Flags().StringArrayVar(&d.envFiles, "from-env-file", nil, "a file of KEY=VALUE lines ('#' comments; a KEY alone takes its value from the environment) (repeatable)")
}

// read returns the keys and values of d, as kubectl reads them; a key
// given twice is an error.
func (d *dataSources) read() (map[string][]byte, error) {
	out := map[string][]byte{}
	add := func(k string, v []byte, from string) error {
		if errs := validation.IsConfigMapKey(k); len(errs) > 0 {
			return fmt.Errorf("%s: %q is not a valid key name: %s", from, k, strings.Join(errs, "; "))
		}
		if _, dup := out[k]; dup {
			return fmt.Errorf("%s: cannot add key %q, another key by that name already exists", from, k)
		}
		out[k] = v
		return nil
	}
	for _, l := range d.literals {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--from-literal %q: want KEY=VALUE", l)
		}
		if err := add(k, []byte(v), "--from-literal"); err != nil {
			return nil, err
		}
	}
	for _, f := range d.files {
		k, path, named := strings.Cut(f, "=")
		if !named {
			path, k = f, ""
		}
		if named && (k == "" || path == "") {
			return nil, fmt.Errorf("--from-file %q: want [KEY=]PATH", f)
		}
		info, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("--from-file: %w", err)
		}
		if info.IsDir() {
			if named {
				return nil, fmt.Errorf("--from-file %q: a key cannot name a directory", f)
			}
			entries, err := os.ReadDir(path)
			if err != nil {
				return nil, fmt.Errorf("--from-file: %w", err)
			}
			for _, e := range entries {
				if !e.Type().IsRegular() || len(validation.IsConfigMapKey(e.Name())) > 0 {
					continue // kubectl skips these too
				}
				b, err := os.ReadFile(filepath.Join(path, e.Name()))
				if err != nil {
					return nil, fmt.Errorf("--from-file: %w", err)
				}
				if err := add(e.Name(), b, "--from-file "+path); err != nil {
					return nil, err
				}
			}
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("--from-file: %w", err)
		}
		if k == "" {
			k = filepath.Base(path)
		}
		if err := add(k, b, "--from-file "+path); err != nil {
			return nil, err
		}
	}
	for _, f := range d.envFiles {
		if err := readEnvFile(f, add); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readEnvFile reads path's KEY=VALUE lines into add, by kubectl's rules
// (pkg/cmd/util/env_file.go): a BOM on the first line is dropped,
// leading blanks are trimmed, blank lines and '#' comments skipped, keys
// are environment variable names, and a KEY with no '=' takes its value
// from this process's environment.
func readEnvFile(path string, add func(k string, v []byte, from string) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--from-env-file: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, manifest.MaxDataBytes)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if !utf8.Valid(line) {
			return fmt.Errorf("--from-env-file %s: line %d is not valid UTF-8", path, n)
		}
		if n == 1 {
			line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf"))
		}
		line = bytes.TrimLeftFunc(line, unicode.IsSpace)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(string(line), "=")
		if errs := validation.IsEnvVarName(k); len(errs) > 0 {
			return fmt.Errorf("--from-env-file %s: line %d: %q is not a valid key name: %s", path, n, k, strings.Join(errs, "; "))
		}
		if !ok {
			v = os.Getenv(k)
		}
		if err := add(k, []byte(v), fmt.Sprintf("--from-env-file %s: line %d", path, n)); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("--from-env-file %s: %w", path, err)
	}
	return nil
}

func newCreateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create configmap|secret ...",
		Short: "Create a ConfigMap or a Secret from literals and files, as kubectl create does",
	}
	var (
		src     dataSources
		dryRun  string
		output  string
		secType string
		cert    string
		key     string
	)
	dry := func(c *cobra.Command) {
		c.Flags().StringVar(&dryRun, "dry-run", "none", "client: print the object (with -o yaml or json) and store nothing")
		c.Flags().StringVarP(&output, "output", "o", "", "with --dry-run=client: yaml or json")
	}
	run := func(c *cobra.Command, o manifest.Object) error {
		if errs := manifest.Validate(o); len(errs) > 0 {
			return fmt.Errorf("%s %q: %w", strings.ToLower(o.Kind), o.Name, errs.ToAggregate())
		}
		switch dryRun {
		case "none", "":
		case "client":
			b, err := manifest.Encode(o)
			if err != nil {
				return err
			}
			if output != "json" {
				if b, err = yaml.JSONToYAML(b); err != nil {
					return err
				}
			}
			_, err = g.stdout.Write(b)
			return err
		default:
			return fmt.Errorf("--dry-run %q: use none or client", dryRun)
		}
		return g.create(c, o)
	}
	configMap := &cobra.Command{
		Use:     "configmap NAME [--from-literal K=V] [--from-file [K=]PATH] [--from-env-file PATH]",
		Aliases: []string{"cm"},
		Short:   "Create a ConfigMap (values that are not UTF-8 go to binaryData)",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			data, err := src.read()
			if err != nil {
				return err
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: args[0], Namespace: g.namespace}}
			for k, v := range data {
				if utf8.Valid(v) {
					setKey(&cm.Data, k, string(v))
				} else {
					setKey(&cm.BinaryData, k, v)
				}
			}
			return run(c, manifest.Object{Kind: manifest.KindConfigMap, Namespace: g.namespace, Name: args[0], ConfigMap: cm})
		},
	}
	src.flags(configMap)
	dry(configMap)
	secret := &cobra.Command{Use: "secret generic|tls NAME ...", Short: "Create a Secret"}
	generic := &cobra.Command{
		Use:   "generic NAME [--type T] [--from-literal K=V] [--from-file [K=]PATH] [--from-env-file PATH]",
		Short: "Create a Secret from literals and files (type Opaque unless --type)",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			data, err := src.read()
			if err != nil {
				return err
			}
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: args[0], Namespace: g.namespace}, Type: corev1.SecretType(secType), Data: data}
			return run(c, manifest.Object{Kind: manifest.KindSecret, Namespace: g.namespace, Name: args[0], Secret: defaulted(s)})
		},
	}
	src.flags(generic)
	dry(generic)
	generic.Flags().StringVar(&secType, "type", "", "the Secret's type (default Opaque)")
	tlsCmd := &cobra.Command{
		Use:   "tls NAME --cert PATH --key PATH",
		Short: "Create a kubernetes.io/tls Secret from a PEM certificate and its key (checked to match)",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if cert == "" || key == "" {
				return fmt.Errorf("--cert and --key: both required (PEM files)")
			}
			crt, err := os.ReadFile(cert)
			if err != nil {
				return fmt.Errorf("--cert: %w", err)
			}
			k, err := os.ReadFile(key)
			if err != nil {
				return fmt.Errorf("--key: %w", err)
			}
			if _, err := tls.X509KeyPair(crt, k); err != nil {
				return fmt.Errorf("--cert %s and --key %s: %w", cert, key, err)
			}
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: args[0], Namespace: g.namespace}, Type: corev1.SecretTypeTLS,
				Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: k}}
			return run(c, manifest.Object{Kind: manifest.KindSecret, Namespace: g.namespace, Name: args[0], Secret: defaulted(s)})
		},
	}
	tlsCmd.Flags().StringVar(&cert, "cert", "", "PEM certificate (chain) file")
	tlsCmd.Flags().StringVar(&key, "key", "", "PEM private key file")
	dry(tlsCmd)
	secret.AddCommand(generic, tlsCmd)
	cmd.AddCommand(configMap, secret)
	cmd.PersistentFlags().StringVarP(&g.namespace, "namespace", "n", "default", "namespace of the object")
	return cmd
}

// create stores o unless an object of its key exists (kubectl create's
// AlreadyExists), and prints the result.
func (g *globals) create(cmd *cobra.Command, o manifest.Object) error {
	c, ctx, cancel, err := g.connect(cmd)
	if err != nil {
		return err
	}
	defer cancel()
	if _, err := c.Get(ctx, o.Kind, o.Namespace, o.Name); err == nil {
		return fmt.Errorf("%s %q already exists in namespace %q: delete it first, or change it with apply", strings.ToLower(o.Kind), o.Name, o.Namespace)
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	return g.store(ctx, c, o)
}

// store applies o and prints the result.
func (g *globals) store(ctx context.Context, c *client.Client, o manifest.Object) error {
	b, err := manifest.Encode(o)
	if err != nil {
		return err
	}
	res, err := c.Apply(ctx, api.ApplyRequest{Objects: []json.RawMessage{b}})
	if err != nil {
		return err
	}
	for _, r := range res {
		fmt.Fprintln(g.stdout, resultLine(r))
	}
	return nil
}

// defaulted returns s with the type the API server defaults.
func defaulted(s *corev1.Secret) *corev1.Secret {
	if s.Type == "" {
		s.Type = corev1.SecretTypeOpaque
	}
	return s
}

func setKey[V any](m *map[string]V, k string, v V) {
	if *m == nil {
		*m = map[string]V{}
	}
	(*m)[k] = v
}
