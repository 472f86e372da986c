package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// TestCapabilities: the default set has no NET_RAW; drop and add change
// it; ALL drops every one.
func TestCapabilities(t *testing.T) {
	def := capabilities(nil, nil)
	if slices.Contains(def, "CAP_NET_RAW") || !slices.Contains(def, "CAP_NET_BIND_SERVICE") || len(def) != 13 {
		t.Fatalf("default: %v", def)
	}
	if got := capabilities([]string{"NET_RAW"}, []string{"ALL"}); !slices.Equal(got, []string{"CAP_NET_RAW"}) {
		t.Fatalf("drop ALL, add NET_RAW: %v", got)
	}
	if got := capabilities(nil, []string{"CHOWN", "SETUID"}); slices.Contains(got, "CAP_CHOWN") || slices.Contains(got, "CAP_SETUID") || len(got) != 11 {
		t.Fatalf("drop two: %v", got)
	}
}

// TestSandboxSpec: what sandboxOpts does to containerd's default spec:
// no /run tmpfs, no rlimits, a read-only cgroupfs, no_new_privs, the
// capabilities, the pids limit and the seccomp profile; the
// securityContext's choices; runAsNonRoot refuses UID 0.
func TestSandboxSpec(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "test")
	build := func(sec reconcile.Security) (*oci.Spec, error) {
		return oci.GenerateSpec(ctx, nil, &containers.Container{ID: "x"}, sandboxOpts(sec, 100)...)
	}
	s, err := build(reconcile.Security{})
	if err != nil {
		t.Fatal(err)
	}
	var cgroupRO bool
	for _, m := range s.Mounts {
		if m.Destination == "/run" {
			t.Error("a tmpfs over /run")
		}
		if m.Destination == "/sys/fs/cgroup" && slices.Contains(m.Options, "ro") {
			cgroupRO = true
		}
	}
	if !cgroupRO {
		t.Error("no read-only cgroupfs at /sys/fs/cgroup")
	}
	if len(s.Process.Rlimits) != 0 {
		t.Errorf("rlimits %v, want the runtime's", s.Process.Rlimits)
	}
	if !s.Process.NoNewPrivileges || s.Linux.Seccomp == nil || pidsLimit(s.Linux.Resources.Pids) != 100 ||
		slices.Contains(s.Process.Capabilities.Bounding, "CAP_NET_RAW") {
		t.Errorf("sandbox: no_new_privs=%v seccomp=%v pids=%v caps=%v", s.Process.NoNewPrivileges, s.Linux.Seccomp != nil, pidsLimit(s.Linux.Resources.Pids), s.Process.Capabilities.Bounding)
	}
	yes, gid := true, int64(3000)
	s, err = build(reconcile.Security{RunAsGroup: &gid, ReadOnlyRootFilesystem: true, AllowPrivilegeEscalation: &yes,
		CapAdd: []string{"NET_RAW"}, Seccomp: "Unconfined"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Process.User.GID != 3000 || !s.Root.Readonly || s.Process.NoNewPrivileges || s.Linux.Seccomp != nil ||
		!slices.Contains(s.Process.Capabilities.Bounding, "CAP_NET_RAW") {
		t.Errorf("securityContext not applied: gid=%d ro=%v nnp=%v seccomp=%v caps=%v", s.Process.User.GID, s.Root.Readonly,
			s.Process.NoNewPrivileges, s.Linux.Seccomp != nil, s.Process.Capabilities.Bounding)
	}
	if _, err := build(reconcile.Security{RunAsNonRoot: true}); !errors.Is(err, ErrRunAsRoot) {
		t.Errorf("runAsNonRoot as UID 0: %v", err)
	}
}

// TestUserTerms: containerd's creation errors in the user's terms.
func TestUserTerms(t *testing.T) {
	uid := int64(4242)
	for _, tt := range []struct {
		err       error
		user      string
		runAsUser *int64
		want      string
	}{
		{errors.New("mount callback failed on /tmp/containerd-mount1234: no users found"), "ghost", nil, "unable to find user ghost: no matching entries in passwd file"},
		{errors.New("mount callback failed on /tmp/containerd-mount1234: no users found"), "ghost:staff", nil, "unable to find user ghost: no matching entries in passwd file"},
		{errors.New("no users found"), "", &uid, "unable to find user 4242: no matching entries in passwd file"},
		{fmt.Errorf("wrapped: %w", &fs.PathError{Op: "lstat", Path: "etc", Err: fs.ErrNotExist}), "ghost", nil, "unable to find user ghost: no matching entries in passwd file"},
		{&fs.PathError{Op: "lstat", Path: "etc/passwd", Err: syscall.ENOENT}, "ghost", nil, "unable to find user ghost: no matching entries in passwd file"},
		{&fs.PathError{Op: "open", Path: "etc/hosts", Err: fs.ErrNotExist}, "ghost", nil, "open etc/hosts: file does not exist"},
		{errors.New("mount callback failed on /tmp/containerd-mount99: open etc/x:\n bad"), "", nil, "open etc/x: bad"},
		{ErrRunAsRoot, "", nil, ErrRunAsRoot.Error()},
	} {
		if got := userTerms(tt.err, tt.user, tt.runAsUser).Error(); got != tt.want {
			t.Errorf("userTerms(%q) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// pidsLimit is a spec's pids limit, -1 when it has none (runtime-spec
// 1.3 made the limit a pointer).
func pidsLimit(p *specs.LinuxPids) int64 {
	if p == nil || p.Limit == nil {
		return -1
	}
	return *p.Limit
}
