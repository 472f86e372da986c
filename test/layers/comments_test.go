package layers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// sources parses every Go file of the repository outside test data and
// vendored trees (comments kept), by path relative to the root.
func sources(t *testing.T) map[string]*ast.File {
	t.Helper()
	dir := root(t)
	fset := token.NewFileSet()
	out := map[string]*ast.File{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != dir && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out[rel] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// docStart reports whether doc, the doc comment of a declaration of
// name, starts with the name (go.dev/doc/comment: "Doc comments ...
// begin with the name of the item"), after an optional article for
// types ("A Builder ...") or "Deprecated:".
func docStart(doc, name string) bool {
	doc = strings.TrimSpace(doc)
	for _, article := range []string{"A ", "An ", "The "} {
		if rest, ok := strings.CutPrefix(doc, article); ok && startsWithWord(rest, name) {
			return true
		}
	}
	return startsWithWord(doc, name)
}

func startsWithWord(s, w string) bool {
	rest, ok := strings.CutPrefix(s, w)
	return ok && (rest == "" || !isIdentRune(rune(rest[0])))
}

func isIdentRune(c rune) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// Every doc comment of a declaration in a production file starts with the
// name it documents: a comment that names another identifier (one
// renamed, or sitting above the wrong function) says what no longer is.
func TestDocCommentsStartWithTheirName(t *testing.T) {
	var bad []string
	for path, f := range sources(t) {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		check := func(doc *ast.CommentGroup, name *ast.Ident, pos token.Pos) {
			if doc == nil || name == nil || name.Name == "_" {
				return
			}
			if text := doc.Text(); !docStart(text, name.Name) {
				first, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
				bad = append(bad, path+": "+name.Name+": "+first)
			}
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				check(d.Doc, d.Name, d.Pos())
			case *ast.GenDecl:
				if d.Lparen.IsValid() {
					// A grouped declaration's doc is the group's; each
					// spec's own doc is checked.
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.TypeSpec:
							check(s.Doc, s.Name, s.Pos())
						case *ast.ValueSpec:
							if len(s.Names) == 1 {
								check(s.Doc, s.Names[0], s.Pos())
							}
						}
					}
					continue
				}
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						check(d.Doc, s.Name, s.Pos())
					case *ast.ValueSpec:
						if len(s.Names) == 1 {
							check(d.Doc, s.Names[0], s.Pos())
						}
					}
				}
			}
		}
	}
	slices.Sort(bad)
	for _, b := range bad {
		t.Error("doc comment does not start with the name it documents: " + b)
	}
}

// cited matches a name cited in backquotes (an identifier, or a
// selector of identifiers: pkg.Name, Type.Method, with an optional ()),
// or first in parentheses when it is a selector or a camelCase
// identifier ("(views.changed)", "(decodeStatuses lets ...)"): the
// house style cites names that way. A plain word in parentheses is
// English, not checked.
var cited = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\\(\\))?`" +
	"|\\(([A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)+|[A-Za-z][a-z0-9]+[A-Z][A-Za-z0-9_]*)(?:\\(\\))?[),;: ]")

// goFile matches a Go file a comment cites: "(snapshot.go)",
// "node/server.go".
var goFile = regexp.MustCompile(`(?:^|[\s(])((?:[\w-]+/)*[\w-]+\.go)\b`)

// A name a comment cites in backquotes exists: each part of it is
// declared somewhere in the repository (a package, type, function,
// method, field, constant or variable), or it is qualified by a package
// from outside the repository that the file imports. Words that are not
// Go (a manifest field, a command) are cited with a space, a flag dash
// or a slash, and are not checked.
func TestCommentsCiteNamesThatExist(t *testing.T) {
	files := sources(t)
	dir := root(t)
	declared := map[string]bool{}
	for _, w := range strings.Fields("bool byte error int int8 int16 int32 int64 uint uint8 uint16 uint32 uint64 uintptr float32 float64 string rune any nil true false iota make new len cap append copy delete close panic recover min max clear") {
		declared[w] = true
	}
	for path, f := range files {
		declared[f.Name.Name] = true
		declared[filepath.Base(filepath.Dir(path))] = true
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				declared[n.Name.Name] = true
			case *ast.TypeSpec:
				declared[n.Name.Name] = true
			case *ast.ValueSpec:
				for _, id := range n.Names {
					declared[id.Name] = true
				}
			case *ast.Field:
				for _, id := range n.Names {
					declared[id.Name] = true
				}
			case *ast.AssignStmt:
				if n.Tok == token.DEFINE {
					for _, e := range n.Lhs {
						if id, ok := e.(*ast.Ident); ok {
							declared[id.Name] = true
						}
					}
				}
			}
			return true
		})
	}
	// The packages from outside the repository that a package imports,
	// by the directory of its files.
	external := map[string]map[string]bool{}
	for path, f := range files {
		d := filepath.Dir(path)
		if external[d] == nil {
			external[d] = map[string]bool{}
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, module) {
				continue
			}
			name := filepath.Base(p)
			if imp.Name != nil {
				name = imp.Name.Name
			} else if v := strings.TrimPrefix(name, "v"); v != name && strings.Trim(v, "0123456789") == "" {
				name = filepath.Base(filepath.Dir(p)) // .../v2 is imported by its parent's name
			}
			external[d][name] = true
		}
	}
	var bad []string
	for path, f := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		external := external[filepath.Dir(path)]
		for _, cg := range f.Comments {
			text := cg.Text()
			for _, m := range goFile.FindAllStringSubmatch(text, -1) {
				if upstream(text, m[1]) {
					continue
				}
				if !exists(filepath.Join(dir, filepath.Dir(path), m[1])) && !exists(filepath.Join(dir, m[1])) {
					bad = append(bad, path+": "+m[1]+" (no such file here or from the root)")
				}
			}
			for _, ix := range cited.FindAllStringSubmatchIndex(text, -1) {
				m := [3]string{}
				for g := 1; g <= 2; g++ {
					if ix[2*g] >= 0 {
						m[g] = text[ix[2*g]:ix[2*g+1]]
					}
				}
				name := m[1] + m[2]
				if end := strings.IndexByte(text[ix[0]:], ')'); end > 0 && upstreamWord.MatchString(text[ix[0]:ix[0]+end]) {
					continue // a name of another project's code: "(pushPullScale, memberlist util.go)"
				}
				if strings.HasSuffix(name, ".go") {
					continue
				}
				parts := strings.Split(name, ".")
				if external[parts[0]] || kubernetesFields[name] {
					continue
				}
				for _, p := range parts {
					if !declared[p] {
						bad = append(bad, path+": "+name+" ("+p+" is declared nowhere)")
						break
					}
				}
			}
		}
	}
	slices.Sort(bad)
	bad = slices.Compact(bad)
	for _, b := range bad {
		t.Error("a comment cites a name that does not exist: " + b)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// upstream reports whether file, cited in text, is another project's: a
// Kubernetes source path (pkg/...) or one named with its owner
// ("memberlist's net.go").
func upstream(text, file string) bool {
	if strings.HasPrefix(file, "pkg/") {
		return true
	}
	i := strings.Index(text, file)
	before := strings.TrimRight(text[:i], " (")
	if strings.HasSuffix(before, "'s") {
		return true
	}
	// The parenthetical or line the file is cited in names the project:
	// "(memberlist net.go, security.go)", "serf.go".
	from := max(strings.LastIndexByte(text[:i], '('), strings.LastIndexByte(text[:i], '\n')) + 1
	return upstreamWord.MatchString(text[from:i] + file)
}

// upstreamWord names a project whose code comments cite.
var upstreamWord = regexp.MustCompile(`\b(memberlist|serf|kubelet|Kubernetes|containerd|badger|CRI)\b`)

// kubernetesFields are manifest fields comments cite by their Kubernetes
// names (in camelCase, as a manifest spells them), not Go identifiers.
var kubernetesFields = map[string]bool{
	"tcpSocket": true, "hostAliases": true, "minReadySeconds": true, "nodeSelector": true, "minimumGracePeriodInSeconds": true,
}
