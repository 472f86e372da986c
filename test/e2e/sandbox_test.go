package e2e

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"

	"github.com/starling-orchestrator/starling/node/api"
	"github.com/starling-orchestrator/starling/test/harness"
)

// TestSandboxAsCRIGivesIt: by default a replica gets CRI's sandbox, not
// containerd's command-line default: no raw sockets (NET_RAW dropped),
// no_new_privs, the RuntimeDefault seccomp profile (mode 2), the
// runtime's open-files limit (not 1024), a cgroupfs at /sys/fs/cgroup, a
// pids limit (--pids-limit 64 here: a process storm stops there). The
// securityContext's choices reach the container: runAsUser/runAsGroup,
// readOnlyRootFilesystem, allowPrivilegeEscalation, capabilities.add,
// seccompProfile Unconfined, in the container and in the OCI spec read
// back through containerd; runAsNonRoot with an image that runs as root
// is refused with a reason.
func TestSandboxAsCRIGivesIt(t *testing.T) {
	n1 := echoNode(t, "--pids-limit", "64")
	workload := func(name string, pod corev1.PodSecurityContext, container corev1.SecurityContext) string {
		return harness.App{Name: name, Namespace: "sandbox", Replicas: 1, Ports: harness.Port8080, Pod: func(spec *corev1.PodSpec) {
			spec.SecurityContext, spec.Containers[0].SecurityContext = &pod, &container
		}}.Deployment()
	}
	apply(t, n1, workload("plain", corev1.PodSecurityContext{}, corev1.SecurityContext{}))
	apply(t, n1, workload("hardened", corev1.PodSecurityContext{RunAsUser: new(int64(1000)), RunAsGroup: new(int64(3000))},
		corev1.SecurityContext{ReadOnlyRootFilesystem: new(true), AllowPrivilegeEscalation: new(false),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}))
	apply(t, n1, workload("raw", corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}},
		corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_RAW"}}}))
	apply(t, n1, workload("nonroot", corev1.PodSecurityContext{RunAsNonRoot: new(true)}, corev1.SecurityContext{}))
	ips, names := map[string]string{}, map[string]string{}
	var nonroot replica
	waitFor(t, 60*time.Second, func() error {
		items, err := apiReplicas(n1)
		if err != nil {
			return err
		}
		for _, r := range items {
			if r.Ready && r.PodIP != "" {
				ips[r.Workload], names[r.Workload] = r.PodIP, r.Name
			}
			if r.Workload == "nonroot" {
				nonroot = r
			}
		}
		if len(ips) != 3 || !strings.Contains(nonroot.Reason, "runAsNonRoot") {
			return fmt.Errorf("ready: %v; nonroot: %+v", ips, nonroot)
		}
		return nil
	})
	if nonroot.Ready || nonroot.Phase == api.PhaseRunning {
		t.Fatalf("a runAsNonRoot replica of a root image runs: %+v", nonroot)
	}
	report := func(w string) map[string]string {
		var body string
		waitFor(t, 10*time.Second, func() (err error) { // running is not yet listening
			body, err = harness.HTTPGet(n1.NetNS, "http://"+ips[w]+":8080/sandbox", 2*time.Second)
			return err
		})
		m := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
			k, v, _ := strings.Cut(line, "=")
			m[k] = v
		}
		t.Logf("%s: %v", w, m)
		return m
	}
	expect := func(w string, m map[string]string, want map[string]string) {
		for k, v := range want {
			if m[k] != v {
				t.Errorf("%s: %s=%q, want %q", w, k, m[k], v)
			}
		}
	}
	plain := report("plain")
	expect("plain", plain, map[string]string{"rawSocket": "refused", "rootfs": "writable", "uid": "0", "NoNewPrivs": "1", "Seccomp": "2"})
	if plain["nofile"] == "1024:1024" {
		t.Errorf("plain: RLIMIT_NOFILE is containerd's command-line default 1024:1024, not the runtime's")
	}
	if n, _ := strconv.Atoi(plain["cgroupEntries"]); n == 0 {
		t.Errorf("plain: /sys/fs/cgroup is empty")
	}
	hardened := report("hardened")
	expect("hardened", hardened, map[string]string{"rawSocket": "refused", "rootfs": "read-only", "uid": "1000", "gid": "3000",
		"NoNewPrivs": "1", "CapEff": "0000000000000000"})
	raw := report("raw")
	expect("raw", raw, map[string]string{"rawSocket": "allowed", "Seccomp": "0"})

	// The same choices, read back from the OCI spec containerd holds.
	client, err := containerd.New(n1.ContainerdSocket(), containerd.WithDefaultNamespace("starling"))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	spec := func(w string) *specs.Spec {
		ctr, err := client.LoadContainer(t.Context(), "sandbox_"+names[w])
		if err != nil {
			t.Fatal(err)
		}
		s, err := ctr.Spec(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ps := spec("plain")
	if !ps.Process.NoNewPrivileges || ps.Linux.Seccomp == nil || ps.Linux.Seccomp.DefaultAction != specs.ActErrno ||
		slices.Contains(ps.Process.Capabilities.Bounding, "CAP_NET_RAW") || !slices.Contains(ps.Process.Capabilities.Bounding, "CAP_CHOWN") ||
		pidsLimit(ps.Linux.Resources.Pids) != 64 {
		t.Errorf("plain's OCI spec: no_new_privs %v, seccomp %+v, capabilities %v, pids %+v", ps.Process.NoNewPrivileges, ps.Linux.Seccomp != nil, ps.Process.Capabilities.Bounding, pidsLimit(ps.Linux.Resources.Pids))
	}
	// Kernel paths masked and read-only as CRI's default spec has them.
	if !slices.Contains(ps.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(ps.Linux.MaskedPaths, "/sys/firmware") || !slices.Contains(ps.Linux.ReadonlyPaths, "/proc/sys") || !slices.Contains(ps.Linux.ReadonlyPaths, "/proc/sysrq-trigger") {
		t.Errorf("plain's OCI spec: masked paths %v, read-only paths %v", ps.Linux.MaskedPaths, ps.Linux.ReadonlyPaths)
	}
	hs := spec("hardened")
	if hs.Process.User.UID != 1000 || hs.Process.User.GID != 3000 || !hs.Root.Readonly || !hs.Process.NoNewPrivileges ||
		len(hs.Process.Capabilities.Bounding)+len(hs.Process.Capabilities.Effective)+len(hs.Process.Capabilities.Permitted) != 0 {
		t.Errorf("hardened's OCI spec: user %+v, read-only root %v, no_new_privs %v, capabilities %+v", hs.Process.User, hs.Root.Readonly, hs.Process.NoNewPrivileges, hs.Process.Capabilities)
	}
	rs := spec("raw")
	if rs.Linux.Seccomp != nil || !slices.Contains(rs.Process.Capabilities.Bounding, "CAP_NET_RAW") {
		t.Errorf("raw's OCI spec: seccomp %v (want none: Unconfined), capabilities %v (want CAP_NET_RAW)", rs.Linux.Seccomp != nil, rs.Process.Capabilities.Bounding)
	}

	body, err := harness.HTTPGet(n1.NetNS, "http://"+ips["plain"]+":8080/spawn?n=200", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	spawned, _ := strconv.Atoi(strings.TrimPrefix(strings.SplitN(body, "\n", 2)[0], "spawned="))
	if spawned >= 64 || !strings.Contains(body, "resource temporarily unavailable") {
		t.Errorf("a process storm in a container with --pids-limit 64: %q", body)
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
