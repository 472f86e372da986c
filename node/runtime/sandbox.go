package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/starling-orchestrator/starling/node/reconcile"
)

// The sandbox every replica gets, as containerd's CRI plugin builds a
// container's spec (pkg/cri/server/container_create_linux.go) rather than
// containerd's command-line default: no tmpfs over /run (it hid what the
// image has there), the runtime's resource limits instead of
// RLIMIT_NOFILE 1024, a read-only cgroupfs at /sys/fs/cgroup (runtimes
// size their heap from it), the RuntimeDefault seccomp profile,
// no_new_privs, the default capabilities without NET_RAW, a pids limit,
// and the securityContext's choices on top.

// defaultCapabilities are the container runtime's default capabilities
// (containerd's and Docker's) without NET_RAW: no raw sockets (ICMP
// spoofing, ARP games on the pod network) unless a container adds it.
var defaultCapabilities = []string{"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
	"NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}

// capabilities returns the capability set ("CAP_..." names, sorted) of a
// container whose securityContext drops drop and adds add: the default
// set less drop ("ALL": every one), plus add.
func capabilities(add, drop []string) []string {
	var caps []string
	if !slices.Contains(drop, "ALL") {
		for _, c := range defaultCapabilities {
			if !slices.Contains(drop, c) {
				caps = append(caps, "CAP_"+c)
			}
		}
	}
	for _, c := range add {
		if c != "ALL" && !slices.Contains(caps, "CAP_"+c) {
			caps = append(caps, "CAP_"+c)
		}
	}
	slices.Sort(caps)
	return caps
}

// ErrRunAsRoot: a container with runAsNonRoot would run as UID 0.
var ErrRunAsRoot = errors.New("container has runAsNonRoot and image will run as root: set securityContext.runAsUser to a non-zero UID, or use an image whose USER is not root")

// sandboxOpts returns the spec options of the sandbox for sec, applied
// after the image's configuration; pidsLimit bounds the container's
// processes (0: no limit).
func sandboxOpts(sec reconcile.Security, pidsLimit int64) []oci.SpecOpts {
	opts := []oci.SpecOpts{
		oci.WithoutRunMount,
		withoutRlimits,
		oci.WithMounts([]specs.Mount{{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup",
			Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}}}),
	}
	if cgroupV2() {
		// The container sees its own cgroup as the root, as CRI gives it.
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.CgroupNamespace}))
	}
	if sec.RunAsUser != nil {
		opts = append(opts, oci.WithUserID(uint32(*sec.RunAsUser)))
	}
	if g := sec.RunAsGroup; g != nil {
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			s.Process.User.GID = uint32(*g)
			return nil
		})
	}
	if g := sec.FSGroup; g != nil {
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			s.Process.User.AdditionalGids = append(s.Process.User.AdditionalGids, uint32(*g))
			return nil
		})
	}
	if sec.RunAsNonRoot {
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			if s.Process.User.UID == 0 {
				return ErrRunAsRoot
			}
			return nil
		})
	}
	if sec.ReadOnlyRootFilesystem {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	if sec.AllowPrivilegeEscalation != nil && *sec.AllowPrivilegeEscalation {
		opts = append(opts, oci.WithNewPrivileges)
	} else {
		opts = append(opts, oci.WithNoNewPrivileges)
	}
	if pidsLimit > 0 {
		opts = append(opts, oci.WithPidsLimit(pidsLimit))
	}
	opts = append(opts, oci.WithCapabilities(capabilities(sec.CapAdd, sec.CapDrop)))
	// Last: the default profile allows the syscalls the capabilities
	// above need.
	if sec.Seccomp != "Unconfined" {
		opts = append(opts, seccomp.WithDefaultProfile())
	}
	return opts
}

// withoutRlimits leaves the process the runtime's resource limits, as CRI
// does (containerd's default spec sets RLIMIT_NOFILE to 1024).
func withoutRlimits(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Process != nil {
		s.Process.Rlimits = nil
	}
	return nil
}

// cgroupV2 reports whether the host runs the unified cgroup hierarchy.
func cgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// hostPath matches the host paths containerd puts in errors (its temporary
// mounts of the image's filesystem), which mean nothing to a user.
var hostPath = regexp.MustCompile(`(mount callback failed on )?/tmp/containerd-mount[0-9]+:? ?`)

// userTerms translates an error of containerd's container creation into
// the user's terms, as CRI reports them: a user the image's /etc/passwd
// does not have is named ("unable to find user ghost: no matching entries
// in passwd file"), host paths are dropped, and the text is one line.
func userTerms(err error, imageUser string, runAsUser *int64) error {
	msg := err.Error()
	switch {
	case errors.Is(err, ErrRunAsRoot):
		return err
	case strings.Contains(msg, "no users found") || strings.Contains(msg, "no such user") || noPasswd(err):
		user := imageUser
		if runAsUser != nil {
			user = strconv.FormatInt(*runAsUser, 10)
		}
		user, _, _ = strings.Cut(user, ":")
		return fmt.Errorf("unable to find user %s: no matching entries in passwd file", user)
	case strings.Contains(msg, "no groups found"):
		return fmt.Errorf("unable to find the group of user %s: no matching entries in group file", imageUser)
	}
	msg = hostPath.ReplaceAllString(msg, "")
	return errors.New(strings.Join(strings.Fields(msg), " "))
}

// noPasswd reports whether err says the image has no /etc/passwd.
// containerd's client reads the file relative to the image's root
// (often straight from the snapshot's layers, without mounting them) and
// reports the first component missing: "lstat etc: file does not exist"
// or "lstat etc/passwd: ...".
func noPasswd(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && errors.Is(pe.Err, fs.ErrNotExist) && (pe.Path == "etc" || pe.Path == "etc/passwd")
}
