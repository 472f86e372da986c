package names

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/starling-orchestrator/starling/node/view"
)

// TestMain lets this test binary stand for the DNS server the
// supervisor starts (os.Executable): with FAKE_DNS_SERVER=serve it
// runs until killed, else it exits at once, as a new binary that fails.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ServerCommand {
		if os.Getenv("FAKE_DNS_SERVER") == "serve" {
			time.Sleep(time.Minute)
		}
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// TestANewDNSServerThatExitsLeavesTheOldOneServing: a server to be
// replaced (here: its upstreams changed) is stopped only once the new
// one has stayed up; a new one that exits at once leaves the old one
// running and named by the PID file, and says so.
func TestANewDNSServerThatExitsLeavesTheOldOneServing(t *testing.T) {
	dir := t.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dnsDir := filepath.Join(dir, "dns")
	if err := os.MkdirAll(dnsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	old := exec.Command(exe, ServerCommand, "--listen", "10.22.1.1:53", "--zone", filepath.Join(dnsDir, zoneFile), "--upstream", "192.0.2.99:53")
	old.Env = append(os.Environ(), "FAKE_DNS_SERVER=serve")
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { old.Process.Kill(); old.Wait() })
	if err := os.WriteFile(filepath.Join(dnsDir, pidFile), []byte(strconv.Itoa(old.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	v := &view.View{Statuses: map[string]view.NodeStatus{"a": {Name: "a", PodSubnet: "10.22.1.0/24", SubnetReady: true}}}
	s := &Supervisor{Self: "a", Domain: "cluster.local", Dir: dnsDir, ResolvConf: resolv, UpstreamResolvConf: filepath.Join(dir, "none"),
		Views: fixedViews{v}, Log: slog.New(slog.DiscardHandler)}
	err = s.ensure(v)
	if err == nil || !strings.Contains(err.Error(), "exited at once") {
		t.Errorf("a new server that exits: %v, want an error saying so", err)
	}
	if pid, ok := s.running(); !ok || pid != old.Process.Pid {
		t.Errorf("running: %d %v, want the old server %d", pid, ok, old.Process.Pid)
	}
	if err := old.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the old server was stopped: %v", err)
	}
}
