package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/starling-orchestrator/starling/node/manifest"
)

// TestCreateReadsDataAsKubectlDoes: --from-literal, --from-file (a named
// key, a file's own name, a directory's regular files with valid names)
// and --from-env-file (comments, blanks, a BOM, a bare KEY from the
// environment) give kubectl's keys; a key given twice names both
// sources' flag.
func TestCreateReadsDataAsKubectlDoes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(content), 0o600)
		return p
	}
	conf := write("app.conf", "color=blue\n")
	write("d/one", "1")
	write("d/two", "2")
	write("d/bad name", "skipped")
	env := write(".env", "\xef\xbb\xbf# a comment\n\n  MODE=fast\nFROM_ENV\nEMPTY=\n")
	t.Setenv("FROM_ENV", "inherited")
	d := dataSources{
		literals: []string{"user=admin", "eq=a=b"},
		files:    []string{conf, "renamed=" + conf, filepath.Join(dir, "d")},
		envFiles: []string{env},
	}
	got, err := d.read()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"user": "admin", "eq": "a=b", "app.conf": "color=blue\n", "renamed": "color=blue\n",
		"one": "1", "two": "2", "MODE": "fast", "FROM_ENV": "inherited", "EMPTY": ""}
	if len(got) != len(want) {
		t.Fatalf("keys %v", got)
	}
	for k, v := range want {
		if string(got[k]) != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for _, bad := range []struct {
		d    dataSources
		want string
	}{
		{dataSources{literals: []string{"a=1", "a=2"}}, `--from-literal: cannot add key "a", another key by that name already exists`},
		{dataSources{literals: []string{"novalue"}}, `--from-literal "novalue": want KEY=VALUE`},
		{dataSources{literals: []string{"a/b=1"}}, `"a/b" is not a valid key name`},
		{dataSources{envFiles: []string{write("bad.env", "1BAD=x\n")}}, `line 1: "1BAD" is not a valid key name`},
		{dataSources{files: []string{filepath.Join(dir, "missing")}}, "--from-file: stat"},
	} {
		if _, err := bad.d.read(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want %q", bad.d, err, bad.want)
		}
	}
}

// TestCreateDryRunPrintsAManifestApplyTakes: create ... --dry-run=client
// -o yaml prints an object that parses back the same (a binary file in
// a ConfigMap goes to binaryData), and stores nothing (no server).
func TestCreateDryRunPrintsAManifestApplyTakes(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "logo.png")
	os.WriteFile(bin, []byte{0x89, 'P', 'N', 'G', 0xff}, 0o600)
	for _, args := range [][]string{
		{"create", "configmap", "web", "-n", "site", "--from-literal", "A=1", "--from-file", bin, "--dry-run=client", "-o", "yaml"},
		{"create", "secret", "generic", "db", "--from-literal", "password=x", "--dry-run=client", "-o", "yaml"},
	} {
		var out bytes.Buffer
		root := NewRoot(nil, &out)
		root.SetArgs(append(args, "--server", "/nonexistent.sock"))
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		objs, err := manifest.Parse(out.Bytes(), "out.yaml")
		if err != nil || len(objs) != 1 {
			t.Fatalf("%v: %v\n%s", args, err, out.String())
		}
		if cm := objs[0].ConfigMap; cm != nil && (cm.Namespace != "site" || cm.Data["A"] != "1" || len(cm.BinaryData["logo.png"]) != 5) {
			t.Fatalf("configmap %+v", cm)
		}
		if s := objs[0].Secret; s != nil && (string(s.Data["password"]) != "x" || s.Type != "Opaque") {
			t.Fatalf("secret %+v", s)
		}
	}
}
