package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/node/client"
	"github.com/starling-orchestrator/starling/node/manifest"
)

// configItem is a stored ConfigMap or Secret as the CLI shows it: a
// Secret as the API answers it, without its values unless revealed
// (sizes holds them, by key).
type configItem struct {
	meta      api.Object
	configMap *corev1.ConfigMap
	secret    *corev1.Secret
	sizes     map[string]int
}

// decodeConfigItem reads it, an answer for kind: not through
// manifest.Decode, since a Secret without its values need not validate
// (a kubernetes.io/tls one lacks tls.crt).
func decodeConfigItem(kind string, it api.Object) (configItem, error) {
	ci := configItem{meta: it, sizes: it.DataSizes}
	if kind == manifest.KindConfigMap {
		ci.configMap = &corev1.ConfigMap{}
		if err := json.Unmarshal(it.Object, ci.configMap); err != nil {
			return ci, err
		}
		ci.sizes = manifest.DataSizes(manifest.Object{ConfigMap: ci.configMap})
		return ci, nil
	}
	ci.secret = &corev1.Secret{}
	if len(it.Object) == 0 {
		return ci, fmt.Errorf("the Secret does not decode on the node that answered")
	}
	if err := json.Unmarshal(it.Object, ci.secret); err != nil {
		return ci, err
	}
	if ci.secret.Data != nil { // revealed
		ci.sizes = manifest.DataSizes(manifest.Object{Secret: ci.secret})
	}
	return ci, nil
}

func (ci configItem) namespace() string {
	if ci.configMap != nil {
		return ci.configMap.Namespace
	}
	return ci.secret.Namespace
}

func (ci configItem) name() string {
	if ci.configMap != nil {
		return ci.configMap.Name
	}
	return ci.secret.Name
}

// getConfigData is 'get configmaps|secrets [NAME]': kubectl's columns
// (NAME, TYPE for Secrets, DATA, AGE), or the objects as YAML or JSON;
// a Secret's values only with reveal and a NAME.
func getConfigData(g *globals, cmd *cobra.Command, c *client.Client, o getOpts, kind, name string, reveal bool) error {
	ctx, cancel := timeoutCtx(cmd)
	defer cancel()
	var items []api.Object
	switch {
	case reveal && (kind != manifest.KindSecret || name == ""):
		return fmt.Errorf("--reveal: give a Secret's NAME (values are shown one Secret at a time)")
	case reveal:
		it, err := c.Reveal(ctx, kind, g.namespace, name)
		if err != nil {
			return err
		}
		items = []api.Object{it}
	default:
		var err error
		if items, err = c.List(ctx, kind); err != nil {
			return err
		}
	}
	var shown []configItem
	for _, it := range items {
		ci, err := decodeConfigItem(kind, it)
		if err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "warning: skipped a stored %s that does not decode (written by node %s, version %s): %v\n", strings.ToLower(kind), it.Origin, it.Version, err)
			continue
		}
		if o.wants(ci.namespace(), g.namespace) && (name == "" || ci.name() == name) {
			shown = append(shown, ci)
		}
	}
	if name != "" && len(shown) == 0 {
		return fmt.Errorf("%s %q not found in namespace %q", strings.ToLower(kind), name, g.namespace)
	}
	if o.output == "json" || o.output == "yaml" {
		return printConfigStructured(g.stdout, o.output, shown, name != "")
	}
	cells := []string{"NAME", "DATA", "AGE"}
	if kind == manifest.KindSecret {
		cells = []string{"NAME", "TYPE", "DATA", "AGE"}
	}
	t := newTable(g.stdout, o.cells("NAMESPACE", cells)...)
	for _, ci := range shown {
		if ci.configMap != nil {
			t.row(o.cells(ci.namespace(), []string{ci.name(), strconv.Itoa(len(ci.sizes)), age(ci.configMap.CreationTimestamp.Time)})...)
		} else {
			t.row(o.cells(ci.namespace(), []string{ci.name(), string(ci.secret.Type), strconv.Itoa(len(ci.sizes)), age(ci.secret.CreationTimestamp.Time)})...)
		}
	}
	return t.flush()
}

// printConfigStructured prints items as JSON or YAML: one named object
// as itself, else a v1 List. A Secret whose values were not revealed
// has no data; in YAML a comment before it gives the sizes.
func printConfigStructured(w io.Writer, output string, items []configItem, one bool) error {
	objs := make([]any, len(items))
	var hidden []string
	for i, ci := range items {
		if ci.configMap != nil {
			objs[i] = ci.configMap
			continue
		}
		objs[i] = ci.secret
		if ci.secret.Data == nil && len(ci.sizes) > 0 {
			hidden = append(hidden, fmt.Sprintf("# %s/%s: %s (values hidden: get secret NAME --reveal shows them)", ci.secret.Namespace, ci.secret.Name, sizeList(ci.sizes)))
		}
	}
	if output == "yaml" {
		for _, h := range hidden {
			fmt.Fprintln(w, h)
		}
	}
	var v any = map[string]any{"apiVersion": "v1", "kind": "List", "items": objs}
	if one {
		v = objs[0]
	}
	_, err := structured(w, output, v)
	return err
}

// sizeList renders sizes as "key: N bytes, ..." in key order.
func sizeList(sizes map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(sizes)) {
		parts = append(parts, fmt.Sprintf("%s: %d bytes", k, sizes[k]))
	}
	return strings.Join(parts, ", ")
}

// describeConfigData prints a ConfigMap (its values, as kubectl does) or
// a Secret (its type and each value's size, never the value).
func describeConfigData(w io.Writer, ci configItem) error {
	p := func(k, v string) { fmt.Fprintf(w, "%-22s %s\n", k+":", v) }
	meta := ci.meta
	written := meta.Origin
	if meta.Signer != "" {
		written += " (signed, key " + meta.Signer + ")"
	}
	p("Name", ci.name())
	p("Namespace", ci.namespace())
	if cm := ci.configMap; cm != nil {
		p("Kind", manifest.KindConfigMap)
		p("Version", meta.Version)
		p("Written by", written)
		p("Created", cm.CreationTimestamp.String())
		p("Labels", labelString(cm.Labels))
		p("Immutable", strconv.FormatBool(cm.Immutable != nil && *cm.Immutable))
		fmt.Fprintln(w, "\nData\n====")
		for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
			fmt.Fprintf(w, "%s:\n----\n%s\n\n", k, printableText(cm.Data[k]))
		}
		fmt.Fprintln(w, "BinaryData\n====")
		for _, k := range slices.Sorted(maps.Keys(cm.BinaryData)) {
			fmt.Fprintf(w, "%s: %d bytes\n", k, len(cm.BinaryData[k]))
		}
		return nil
	}
	s := ci.secret
	p("Kind", manifest.KindSecret)
	p("Version", meta.Version)
	p("Written by", written)
	p("Created", s.CreationTimestamp.String())
	p("Labels", labelString(s.Labels))
	p("Type", string(s.Type))
	p("Immutable", strconv.FormatBool(s.Immutable != nil && *s.Immutable))
	fmt.Fprintln(w, "\nData\n====")
	for _, k := range slices.Sorted(maps.Keys(ci.sizes)) {
		fmt.Fprintf(w, "%s: %d bytes\n", k, ci.sizes[k])
	}
	return nil
}

// printableText is s with control characters other than newlines and
// tabs shown as spaces (a value must not drive the terminal).
func printableText(s string) string {
	return strings.Map(func(c rune) rune {
		if c != '\n' && c != '\t' && unicode.IsControl(c) {
			return ' '
		}
		return c
	}, s)
}
