// Package layers holds tests of the repository's structure: which
// package may import which (docs/architecture.md), and the size of the
// wiring layer's files and types.
package layers

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/starling-orchestrator/starling/"

// allowed maps each package (a prefix ending in "/" covers a tree) to the
// Starling packages it may import; what is not listed may not be
// imported. It is the table of docs/architecture.md.
var allowed = map[string][]string{
	"placement":       nil,
	"gossip/hlc":      nil,
	"gossip/crdt":     {"gossip/hlc"},
	"gossip/testnet":  nil,
	"gossip":          {"gossip/crdt", "gossip/hlc"},
	"net/xtables":     nil,
	"net/":            {"gossip/hlc", "net/xtables"},
	"node/api":        nil,
	"node/manifest":   nil,
	"node/probe":      nil,
	"node/logfile":    nil,
	"node/pidns":      nil,
	"node/fencewatch": nil,
	"node/preflight":  nil,
	"node/quorum":     {"gossip/crdt"},
	"node/reconcile":  {"node/api", "placement"},
	"node/rollout":    {"node/api", "node/manifest"},
	"node/runtime":    {"node/api", "node/dns", "node/logfile", "node/pidns", "node/probe", "node/reconcile", "node/volumes"},
	"node/dns":        nil,
	"node/names":      {"node/api", "node/dns", "node/manifest", "node/pidns", "node/view"},
	"node/ingress":    {"node/api", "node/manifest", "node/view", "placement"},
	"node/announce":   {"node/view", "placement"},
	"node/volumes":    {"gossip/hlc", "node/api", "node/manifest", "node/reconcile", "node/view"},
	"node/store":      {"gossip/crdt"},
	"node/client":     {"node/api"},
	"node/apiserver":  {"node/api", "node/manifest"},
	"node/member":     nil,
	"node/sealed":     {"gossip/crdt", "gossip/hlc"},
	"node/damping":    {"gossip", "node/view"},
	"node/trust":      {"gossip", "gossip/crdt", "gossip/hlc", "node/api", "node/apiserver", "node/client", "node/member", "node/view"},
	"node/dataplane":  {"gossip", "net/", "node/view"},
	"node/view": {"gossip", "gossip/crdt", "gossip/hlc", "net/ipam", "net/service", "node/api", "node/manifest", "node/member",
		"node/probe", "node/reconcile", "placement"},
	"node": {"gossip", "gossip/crdt", "gossip/hlc", "net/", "node/api", "node/apiserver", "node/client", "node/logfile",
		"node/manifest", "node/preflight", "node/probe", "node/quorum", "node/reconcile", "node/rollout", "node/runtime",
		"node/store", "node/member", "node/view", "node/dataplane", "node/trust", "node/damping", "node/sealed", "node/volumes", "node/names", "node/dns", "node/fencewatch", "node/ingress", "node/announce", "placement"},
	"cli":          {"node", "node/api", "node/client", "node/dns", "node/fencewatch", "node/manifest", "node/rollout", "node/trust"},
	"cmd/starling": {"cli", "node/logfile", "node/pidns"},
}

// rule returns the import rule of pkg (the most specific entry).
func rule(pkg string) ([]string, bool) {
	if r, ok := allowed[pkg]; ok {
		return r, true
	}
	best := ""
	for p := range allowed {
		if strings.HasSuffix(p, "/") && strings.HasPrefix(pkg, p) && len(p) > len(best) {
			best = p
		}
	}
	r, ok := allowed[best]
	return r, ok && best != ""
}

func may(rules []string, imp string) bool {
	for _, r := range rules {
		if imp == r || strings.HasSuffix(r, "/") && strings.HasPrefix(imp, r) {
			return true
		}
	}
	return false
}

func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPackagesImportOnlyWhatTheirLayerMay(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		pkg := strings.TrimPrefix(f[0], module)
		if strings.HasPrefix(pkg, "test/") {
			continue // tests and tools may use anything
		}
		rules, ok := rule(pkg)
		if !ok {
			t.Errorf("package %s has no rule in the layers table (test/layers and docs/architecture.md)", pkg)
			continue
		}
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			if imp = strings.TrimPrefix(imp, module); !may(rules, imp) {
				t.Errorf("%s imports %s, which its layer may not (docs/architecture.md)", pkg, imp)
			}
		}
	}
}

// The wiring layer stays made of small parts: no file of package node
// over 400 lines, no type with more than 20 methods, an Agent of fewer
// than 15 fields (its parts grouped by role), and under 8,000 lines of
// code in all (the rest lives in its sub-packages).
func TestNodeIsMadeOfSmallParts(t *testing.T) {
	dir := filepath.Join(root(t), "node")
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	methods := map[string]int{}
	lines := 0
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		n := bytes.Count(b, []byte("\n"))
		if n > 400 {
			t.Errorf("%s has %d lines, over 400: split it", filepath.Base(path), n)
		}
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		lines += n
		f, err := parser.ParseFile(fset, path, b, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == "Agent" {
				if st, ok := ts.Type.(*ast.StructType); ok && st.Fields.NumFields() >= 15 {
					t.Errorf("Agent has %d fields, 15 or more: group its parts by role (docs/architecture.md)", st.Fields.NumFields())
				}
			}
			return true
		})
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) == 0 {
				continue
			}
			typ := fn.Recv.List[0].Type
			if s, ok := typ.(*ast.StarExpr); ok {
				typ = s.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				methods[id.Name]++
			}
		}
	}
	if lines >= 8000 {
		t.Errorf("package node has %d lines of code (tests aside), 8,000 or more: move a part to a package of its own", lines)
	}
	for typ, n := range methods {
		if n > 20 {
			t.Errorf("type %s of package node has %d methods, over 20: give part of its work to a type of its own", typ, n)
		}
	}
}

// TestWalkOfAnApplyIsTrue: docs/architecture.md's walk of an apply
// (from the CLI to the owner's containerd call) names files that exist,
// each once, and at most 30 of them (issue 40).
func TestWalkOfAnApplyIsTrue(t *testing.T) {
	dir := root(t)
	b, err := os.ReadFile(filepath.Join(dir, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## The walk of an apply")
	if start < 0 {
		t.Fatal("docs/architecture.md has no section \"The walk of an apply\"")
	}
	section := doc[start+3:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	row := regexp.MustCompile(`(?m)^\| (\d+) \| ([^ |]+\.go) \|`)
	seen := map[string]bool{}
	rows := row.FindAllStringSubmatch(section, -1)
	for i, m := range rows {
		if m[1] != strconv.Itoa(i+1) {
			t.Errorf("walk row %s is number %d in order", m[1], i+1)
		}
		if seen[m[2]] {
			t.Errorf("walk lists %s twice", m[2])
		}
		seen[m[2]] = true
		if _, err := os.Stat(filepath.Join(dir, m[2])); err != nil {
			t.Errorf("walk names %s, which does not exist", m[2])
		}
	}
	if len(rows) == 0 || len(rows) > 30 {
		t.Errorf("the walk of an apply crosses %d files, want 1 to 30", len(rows))
	}
}
