package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// ToolCache is where GoTool keeps the programs it builds, by version:
// one build per machine, not one per test run.
const ToolCache = "/var/cache/starling/tools"

var toolMu sync.Mutex

// GoTool returns the path of a Go program, pkg at version ("pkg@v1.2.3",
// e.g. github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.3), built with
// `go install` from the module proxy into ToolCache the first time.
func GoTool(ctx context.Context, pkgAtVersion string) (string, error) {
	pkg, version, ok := strings.Cut(pkgAtVersion, "@")
	if !ok || version == "" {
		return "", fmt.Errorf("GoTool %q: want PACKAGE@VERSION", pkgAtVersion)
	}
	name := filepath.Base(pkg)
	dir := filepath.Join(ToolCache, name+"-"+version)
	bin := filepath.Join(dir, name)
	toolMu.Lock()
	defer toolMu.Unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "install", pkgAtVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go install %s: %v\n%s", pkgAtVersion, err, out)
	}
	return bin, nil
}
