package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/starling-orchestrator/starling/node/trust"
)

// TestNodeLabelsAreValidated: the defaults validate; labels that peers
// would refuse are refused at start, naming the flag. (Whether a node has
// its cluster's credentials is checked by setupCredentials.)
func TestNodeLabelsAreValidated(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Name = "n1"
	if _, _, err := cfg.validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cfg.Labels = map[string]string{"bad key!": "x"}
	if _, _, err := cfg.validate(); err == nil || !strings.Contains(err.Error(), "--node-label") {
		t.Fatalf("bad label: %v", err)
	}
}

// TestSecretFilesOpenToOthersAreRefused: a key or token file that group or
// others can read is refused with the chmod that fixes it; mode 0600 is
// read.
func TestSecretFilesOpenToOthersAreRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(path, []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := trust.ReadSecretFile("--encrypt-key-file", path)
	if err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) || !strings.Contains(err.Error(), "0644") {
		t.Fatalf("0644: %v", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := trust.ReadSecretFile("--encrypt-key-file", path); err != nil || string(b) != "secret\n" {
		t.Fatalf("0600: %q %v", b, err)
	}
	// The node key is made private on first start and read back.
	dir := t.TempDir()
	k1, err := trust.LoadOrCreateNodeKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, trust.NodeKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("node key mode %v, %v", fi.Mode(), err)
	}
	k2, err := trust.LoadOrCreateNodeKey(dir)
	if err != nil || !k1.Equal(k2) {
		t.Fatalf("node key not kept across starts: %v", err)
	}
}
