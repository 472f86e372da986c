package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/starling-orchestrator/starling/node/reconcile"
	"github.com/starling-orchestrator/starling/node/volumes"
)

// volumeMounts makes rep's volumes under its pod directory and returns
// the container's mounts of them: an emptyDir's directory (tmpfs for
// medium Memory, sizeLimit its size), a hostPath under
// --allow-host-path, the files of projected volumes (volumes.Write; on
// tmpfs when they hold a Secret's values, and mounted read-only, as the
// kubelet mounts them). A subPath binds what it names now (a projected
// file is then not updated, as in Kubernetes); a subPathExpr is
// expanded against vars, the container's environment.
func (r *Runtime) volumeMounts(rep reconcile.Replica, podDir string, vars map[string]string) ([]specs.Mount, error) {
	dirs := map[string]string{}
	readOnly := map[string]bool{}
	for _, v := range rep.Spec.Volumes {
		dir := volumes.Dir(podDir, v.Name)
		switch {
		case v.HostPath != "":
			if !r.hostPathAllowed(v.HostPath) {
				allowed := "none"
				if len(r.cfg.AllowHostPath) > 0 {
					allowed = strings.Join(r.cfg.AllowHostPath, ", ")
				}
				return nil, fmt.Errorf("volume %q: hostPath %s is not under a directory the node allows (allowed: %s; start the agent with --allow-host-path DIR to allow one)", v.Name, v.HostPath, allowed)
			}
			if v.HostPathCreate {
				if err := os.MkdirAll(v.HostPath, 0o755); err != nil {
					return nil, fmt.Errorf("volume %q: %w", v.Name, err)
				}
			} else if info, err := os.Stat(v.HostPath); err != nil || !info.IsDir() {
				return nil, fmt.Errorf("volume %q: hostPath %s is not a directory on node %s (type DirectoryOrCreate makes it)", v.Name, v.HostPath, r.cfg.Node)
			}
			dir = v.HostPath
		case v.EmptyDir:
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return nil, err
			}
			if v.Memory {
				opts := "mode=0777"
				if v.SizeLimit > 0 {
					opts += ",size=" + strconv.FormatInt(v.SizeLimit, 10)
				}
				if err := mountTmpfs(dir, opts); err != nil {
					return nil, fmt.Errorf("volume %q: %w", v.Name, err)
				}
			}
			if err := os.Chmod(dir, 0o777); err != nil {
				return nil, err
			}
		default:
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			if v.Sensitive() {
				if err := mountTmpfs(dir, "mode=0755"); err != nil {
					return nil, fmt.Errorf("volume %q: %w", v.Name, err)
				}
			}
			if _, err := volumes.Write(dir, rep.Files[v.Name]); err != nil {
				return nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			readOnly[v.Name] = true
		}
		dirs[v.Name] = dir
	}
	var out []specs.Mount
	for _, m := range rep.Spec.Mounts {
		src, ok := dirs[m.Volume]
		if !ok {
			return nil, fmt.Errorf("volumeMount %s: no volume %q", m.Path, m.Volume)
		}
		sub := m.SubPath
		if m.SubPathExpr != "" {
			sub = expand(m.SubPathExpr, vars)
		}
		if sub != "" {
			p, err := volumes.Resolve(src, sub)
			if err != nil {
				return nil, fmt.Errorf("volumeMount %s: %w", m.Path, err)
			}
			src = p
		}
		opts := []string{"rbind", "rprivate"}
		if m.ReadOnly || readOnly[m.Volume] {
			opts = append(opts, "ro")
		}
		out = append(out, specs.Mount{Destination: m.Path, Type: "bind", Source: src, Options: opts})
	}
	return out, nil
}

// hostPathAllowed reports whether p lies under one of --allow-host-path.
func (r *Runtime) hostPathAllowed(p string) bool {
	for _, a := range r.cfg.AllowHostPath {
		if p == a || strings.HasPrefix(p, a+"/") {
			return true
		}
	}
	return false
}

// mountTmpfs mounts a tmpfs on dir unless one is there already (a
// create retried, an agent restarted).
func mountTmpfs(dir, opts string) error {
	var st, parent unix.Statfs_t
	if unix.Statfs(dir, &st) == nil && unix.Statfs(filepath.Dir(dir), &parent) == nil && st.Type == unix.TMPFS_MAGIC && st.Fsid != parent.Fsid {
		return nil
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	return nil
}

// releaseVolumes unmounts the tmpfs volumes of the pod directory podDir
// (before it is removed).
func releaseVolumes(podDir string) error {
	entries, err := os.ReadDir(filepath.Join(podDir, "volumes"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := volumes.Dir(podDir, e.Name())
		for {
			err := unix.Unmount(p, unix.MNT_DETACH)
			if err != nil {
				if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
				}
				break
			}
		}
	}
	return errors.Join(errs...)
}
