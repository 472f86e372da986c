// Package e2e runs Starling's end-to-end tests: the real starling binary,
// real containerd and real containers, each node in a network namespace
// (see test/harness). They need root, containerd, runc and the CNI
// plugins; `make test` installs them. Without root they are skipped with
// a message; with STARLING_E2E_REQUIRED=1 (set by .ci/run) a missing
// prerequisite fails instead, so CI cannot pass without running them.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/test/harness"
	"github.com/starling-orchestrator/starling/test/imagebuild"
)

// Built once in TestMain.
var (
	binary    string
	hostile   string // test/hostile, the hostile peer
	echoV1Tar string
	echoV2Tar string
	skipWhy   string
	// nginxTar and redisTar are images of Debian's nginx and redis
	// (imagebuild.Nginx, Redis), short names; realSkip says why not.
	nginxTar, redisTar, realSkip string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if why := missingPrereq(); why != "" {
		if os.Getenv("STARLING_E2E_REQUIRED") == "1" {
			fmt.Fprintln(os.Stderr, "e2e prerequisites missing and STARLING_E2E_REQUIRED=1:", why)
			return 1
		}
		skipWhy = why
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "starling-e2e-build-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	mod, err := harness.ModuleDir()
	if err == nil {
		binary, err = harness.BuildBinary(ctx, mod, dir)
	}
	if err == nil {
		hostile = filepath.Join(dir, "hostile")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", hostile, "./test/hostile")
		cmd.Dir = mod
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build ./test/hostile: %v\n%s", berr, out)
		}
	}
	if err == nil {
		echoV1Tar = filepath.Join(dir, "echo-v1.tar")
		err = imagebuild.Echo(ctx, mod, "starling.local/echo:v1", "v1", echoV1Tar)
	}
	if err == nil {
		echoV2Tar = filepath.Join(dir, "echo-v2.tar")
		err = imagebuild.Echo(ctx, mod, "starling.local/echo:v2", "v2", echoV2Tar)
	}
	if err == nil {
		debs := os.Getenv("STARLING_TEST_DEBS")
		if debs == "" {
			debs = "/var/cache/starling/test-debs"
		}
		nginxTar, redisTar = filepath.Join(dir, "nginx.tar"), filepath.Join(dir, "redis.tar")
		rerr := imagebuild.Nginx(ctx, debs, "nginx:1.22", nginxTar)
		if rerr == nil {
			rerr = imagebuild.Redis(ctx, debs, "redis:7.0", redisTar)
		}
		if rerr != nil && os.Getenv("STARLING_E2E_REQUIRED") == "1" {
			err = fmt.Errorf("images of Debian's nginx and redis ('make deps' downloads the packages): %w", rerr)
		} else if rerr != nil {
			realSkip = rerr.Error()
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	code := m.Run()
	fmt.Printf("e2e: %d tests ran against real containerd in network namespaces\n", clustersStarted.Load())
	return code
}

// keepLog copies node's whole agent log to dir/<test>-<node>.log, for a
// failure whose cause is older than the diagnostics' last 60 lines
// (STARLING_E2E_KEEP_LOGS=dir).
func keepLog(t *testing.T, node *harness.Node, dir string) {
	// A goroutine dump first (Go's SIGQUIT), for an agent that hangs.
	if pid := node.AgentPID(); pid > 0 {
		syscall.Kill(pid, syscall.SIGQUIT)
		time.Sleep(300 * time.Millisecond)
	}
	data, err := os.ReadFile(node.AgentLogPath())
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err == nil {
		name := fmt.Sprintf("%s-%s.log", filepath.Base(t.Name()), node.Name)
		err = os.WriteFile(filepath.Join(dir, name), data, 0o644)
	}
	if err != nil {
		t.Logf("keeping %s's agent log: %v", node.Name, err)
	}
	if wd, err := os.ReadFile(filepath.Join(node.DataDir, "fence-watchdog.log")); err == nil {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s-fence-watchdog.log", filepath.Base(t.Name()), node.Name)), wd, 0o644)
	}
}

// clustersStarted counts tests that brought up a cluster.
var clustersStarted atomic.Int32

func missingPrereq() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	for _, bin := range []string{"containerd", "runc", "ip", "nsenter", "iptables", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not found (make deps installs it)"
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		if _, err2 := os.Stat("/opt/cni/bin/bridge"); err2 != nil {
			return "CNI plugins not found (Debian package containernetworking-plugins)"
		}
	}
	return ""
}

// newCluster creates a cluster of n nodes with running agents, torn down
// when the test ends (also on failure, after printing diagnostics).
func newCluster(t *testing.T, n int, agentArgs ...string) *harness.Cluster {
	t.Helper()
	c := emptyCluster(t)
	for i := 1; i <= n; i++ {
		node, err := c.AddNode(fmt.Sprintf("n%d", i), i)
		if err != nil {
			t.Fatal(err)
		}
		if err := node.StartAgent(agentArgs...); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// emptyCluster is a LAN with no node yet, torn down (its nodes' logs
// shown on failure) when the test ends.
func emptyCluster(t *testing.T) *harness.Cluster {
	t.Helper()
	if skipWhy != "" {
		t.Skip("e2e prerequisites missing: " + skipWhy)
	}
	clustersStarted.Add(1)
	// A short directory: unix socket paths (containerd's) must fit 108 bytes,
	// and t.TempDir embeds the test name.
	dir, err := os.MkdirTemp("", "st")
	if err != nil {
		t.Fatal(err)
	}
	c, err := harness.New(dir, binary, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	// STARLING_E2E_PROXY_MODE=iptables runs the suite on the iptables
	// backend (make test runs the Service tests so too); unset, the agent
	// chooses (nftables here).
	c.ProxyMode = os.Getenv("STARLING_E2E_PROXY_MODE")
	t.Cleanup(func() {
		if t.Failed() {
			keep := os.Getenv("STARLING_E2E_KEEP_LOGS")
			for _, node := range c.Nodes {
				t.Log(node.Diagnostics())
				if keep != "" {
					keepLog(t, node, keep)
				}
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return c
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// eventually polls f every 100 ms until it returns nil or timeout passes,
// and returns how long it took or the last error.
func eventually(timeout time.Duration, f func() error) (time.Duration, error) {
	return harness.Poll(context.Background(), 100*time.Millisecond, timeout, f)
}
