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
// container c's mounts of them: an emptyDir's directory (tmpfs for
// medium Memory, sizeLimit its size), a hostPath under
// --allow-host-path, the files of projected volumes (volumes.Write; on
// tmpfs when they hold a Secret's values, and mounted read-only, as the
// kubelet mounts them). A subPath binds what it names now (a projected
// file is then not updated, as in Kubernetes); a subPathExpr is
// expanded against vars, the container's environment.
//
// setup false (a container added to a replica whose volumes its create
// made) only finds the volumes and mounts them.
func (r *Runtime) volumeMounts(rep reconcile.Replica, c reconcile.Spec, podDir string, vars map[string]string, setup bool) ([]specs.Mount, error) {
	r.volumes.Lock()
	defer r.volumes.Unlock()
	dirs := map[string]string{}
	projected := map[string]bool{}
	readOnly := map[string]bool{} // claims mounted read-only
	for _, v := range rep.Spec.Volumes {
		dir := volumes.Dir(podDir, v.Name)
		switch {
		case v.Claim != "":
			if v.ClaimID == "" || r.cfg.ClaimDir == "" {
				return nil, fmt.Errorf("volume %q: persistentvolumeclaim %q has no volume on node %s", v.Name, v.Claim, r.cfg.Node)
			}
			dir = volumes.ClaimDir(r.cfg.ClaimDir, filepath.Base(v.ClaimID))
			if _, err := os.Stat(dir); err != nil {
				return nil, fmt.Errorf("volume %q: the volume of persistentvolumeclaim %q: %w", v.Name, v.Claim, err)
			}
			if g := v.Group; g != nil && setup { // fsGroup: its group's, setgid, as for an emptyDir
				if err := os.Chown(dir, -1, int(*g)); err != nil {
					return nil, err
				}
				if err := os.Chmod(dir, 0o777|os.ModeSetgid); err != nil {
					return nil, err
				}
			}
			if v.ClaimReadOnly {
				readOnly[v.Name] = true
			}
		case v.HostPath != "":
			p, err := r.hostDir(v)
			if err != nil {
				return nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			dir = p
		case !setup:
			projected[v.Name] = !v.EmptyDir
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
			mode := os.FileMode(0o777)
			if g := v.Group; g != nil { // fsGroup: its group's, setgid
				if err := os.Chown(dir, -1, int(*g)); err != nil {
					return nil, err
				}
				mode |= os.ModeSetgid
			}
			if err := os.Chmod(dir, mode); err != nil {
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
			if _, err := volumes.Write(dir, rep.Files[v.Name], v.Group); err != nil {
				return nil, fmt.Errorf("volume %q: %w", v.Name, err)
			}
			projected[v.Name] = true
		}
		dirs[v.Name] = dir
	}
	var out []specs.Mount
	for i, m := range c.Mounts {
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
			if err != nil && m.SubPathExpr != "" {
				// Not the expanded path: it may hold a Secret's value.
				return nil, fmt.Errorf("volumeMount %s: subPathExpr %q does not name a path inside volume %q", m.Path, m.SubPathExpr, m.Volume)
			}
			if err != nil {
				return nil, fmt.Errorf("volumeMount %s: %w", m.Path, err)
			}
			if projected[m.Volume] {
				// A copy of its own, beside the volume's files (on its
				// tmpfs for a Secret's): the file a subPath names does
				// not follow updates, as in Kubernetes, and a restart
				// still finds it after an update removed the directory
				// it was in.
				cp := filepath.Join(src, "..subpath_"+subpathName(c.Name, i))
				if err := copyTree(p, cp); err != nil {
					return nil, fmt.Errorf("volumeMount %s: %w", m.Path, err)
				}
				p = cp
			}
			src = p
		}
		opts := []string{"rbind", "rprivate"}
		if m.ReadOnly || projected[m.Volume] || readOnly[m.Volume] {
			opts = append(opts, "ro")
		}
		out = append(out, specs.Mount{Destination: m.Path, Type: "bind", Source: src, Options: opts})
	}
	return out, nil
}

// subpathName names the copy of the subPath of mount i of container
// name: "<name>_<i>", or "<i>" for a Spec without a name (made before
// pods had several containers).
func subpathName(name string, i int) string {
	if name == "" {
		return strconv.Itoa(i)
	}
	return name + "_" + strconv.Itoa(i)
}

// hostDir is the node directory of hostPath volume v: under one of
// --allow-host-path, with symlinks resolved and checked to stay under
// it (made, for the type "DirectoryOrCreate", one directory at a time
// refusing symlinks), refused otherwise with a reason that names the
// flag.
func (r *Runtime) hostDir(v reconcile.Volume) (string, error) {
	for _, a := range r.cfg.AllowHostPath {
		rel, under := strings.CutPrefix(v.HostPath, a+"/")
		if v.HostPath == a {
			rel, under = "", true
		}
		if !under {
			continue
		}
		root, err := filepath.EvalSymlinks(a)
		if err != nil {
			return "", fmt.Errorf("--allow-host-path %s: %w", a, err)
		}
		if rel != "" && v.HostPathCreate {
			if err := volumes.MkdirBeneath(root, rel); err != nil {
				return "", fmt.Errorf("hostPath %s: %w", v.HostPath, err)
			}
		}
		p, err := filepath.EvalSymlinks(filepath.Join(root, rel))
		if err != nil {
			return "", fmt.Errorf("hostPath %s is not a directory on node %s (the type DirectoryOrCreate makes it)", v.HostPath, r.cfg.Node)
		}
		if p != root && !strings.HasPrefix(p, root+"/") {
			return "", fmt.Errorf("hostPath %s leads outside --allow-host-path %s (through a symlink)", v.HostPath, a)
		}
		if info, err := os.Stat(p); err != nil || !info.IsDir() {
			return "", fmt.Errorf("hostPath %s is not a directory on node %s", v.HostPath, r.cfg.Node)
		}
		return p, nil
	}
	allowed := "none"
	if len(r.cfg.AllowHostPath) > 0 {
		allowed = strings.Join(r.cfg.AllowHostPath, ", ")
	}
	return "", fmt.Errorf("hostPath %s is not under a directory the node allows (allowed: %s; start the agent with --allow-host-path DIR to allow one)", v.HostPath, allowed)
}

// UpdateVolume writes files into projected volume v of container id,
// if that volume is here (made by its create, not removed since), and
// reports whether anything changed (volumes.Updater). A volume that
// holds a Secret's values is written only while it is a tmpfs.
func (r *Runtime) UpdateVolume(id string, v reconcile.Volume, files []reconcile.File) (bool, error) {
	r.volumes.Lock()
	defer r.volumes.Unlock()
	dir := volumes.Dir(r.podDir(id), v.Name)
	if _, err := os.Lstat(filepath.Join(dir, "..data")); err != nil {
		return false, nil
	}
	if v.Sensitive() && !isTmpfs(dir) {
		return false, fmt.Errorf("volume %q of %s holds a Secret's values but is not a tmpfs: not written", v.Name, id)
	}
	return volumes.Write(dir, files, v.Group)
}

// removePodDir unmounts the replica's tmpfs volumes and removes its pod
// directory.
func (r *Runtime) removePodDir(id string) {
	r.volumes.Lock()
	defer r.volumes.Unlock()
	if err := releaseVolumes(r.podDir(id)); err != nil {
		r.log.Warn("unmount the replica's volumes", "container", id, "err", err)
	}
	if err := os.RemoveAll(r.podDir(id)); err != nil {
		r.log.Warn("remove the replica's pod directory", "container", id, "err", err)
	}
}

// copyTree copies the file or directory src to dst (made anew), keeping
// modes; symlinks and devices inside are not copied.
func copyTree(src, dst string) error {
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, info.Mode().Perm())
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, info.Mode().Perm())
		}
		return nil
	})
}

// isTmpfs reports whether dir is a tmpfs mount of its own.
func isTmpfs(dir string) bool {
	var st, parent unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && unix.Statfs(filepath.Dir(dir), &parent) == nil && st.Type == unix.TMPFS_MAGIC && st.Fsid != parent.Fsid
}

// mountTmpfs mounts a tmpfs on dir unless one is there already (a
// create retried, an agent restarted).
func mountTmpfs(dir, opts string) error {
	if isTmpfs(dir) {
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
