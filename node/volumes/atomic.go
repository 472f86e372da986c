// Package volumes keeps a replica's volumes on its node: the directories
// of emptyDir volumes (tmpfs for medium Memory), and the files of
// configMap, secret, downwardAPI and projected volumes, written as the
// kubelet's AtomicWriter writes them (pkg/volume/util/atomic_writer.go)
// so a container never reads half of an update, and rewritten when the
// ConfigMaps and Secrets they come from change (Updater). Volumes that
// hold a Secret's values live on tmpfs, never on the node's disk.
package volumes

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

// Dir is where volume name of the replica whose pod directory is podDir
// lives on the node.
func Dir(podDir, name string) string { return filepath.Join(podDir, "volumes", name) }

// dataLink is the symlink to the directory of the current files: every
// visible name in a volume is a symlink through it (NAME -> ..data/NAME),
// so one rename of dataLink swaps them all at once.
const dataLink = "..data"

// Write makes dir hold exactly files (paths relative, checked to stay
// inside dir), owned by group gid when it is set (a pod's fsGroup),
// swapping them in at once, and reports whether anything changed: the files go to a new hidden directory, the ..data symlink
// is replaced by a rename, new visible names are linked through it and
// names no longer in files removed, then the old directory is removed.
func Write(dir string, files []reconcile.File, gid *int64) (bool, error) {
	for _, f := range files {
		if !reconcile.CleanSubPath(f.Path) || strings.HasPrefix(f.Path, "..") {
			return false, fmt.Errorf("volume file %q: must be a relative path inside the volume, not starting with '..'", f.Path)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	old, _ := os.Readlink(filepath.Join(dir, dataLink))
	if old != "" && same(filepath.Join(dir, old), files) {
		return false, nil
	}
	ts, err := os.MkdirTemp(dir, "..data_")
	if err != nil {
		return false, err
	}
	if err := os.Chmod(ts, 0o755); err != nil {
		return false, err
	}
	if err := chgrp(ts, gid); err != nil {
		return false, err
	}
	for _, f := range files {
		p := filepath.Join(ts, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return false, err
		}
		if err := os.WriteFile(p, f.Data, fs.FileMode(f.Mode)&0o777); err != nil {
			return false, err
		}
		if err := os.Chmod(p, fs.FileMode(f.Mode)&0o777); err != nil { // past the umask
			return false, err
		}
		for q := p; q != ts; q = filepath.Dir(q) {
			if err := chgrp(q, gid); err != nil {
				return false, err
			}
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, dataLink)); err != nil {
		return false, err
	}
	visible := map[string]bool{}
	for _, f := range files {
		top, _, _ := strings.Cut(f.Path, "/")
		visible[top] = true
	}
	for name := range visible {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join(dataLink, name) {
			continue
		}
		if err := os.Symlink(filepath.Join(dataLink, name), link); err != nil {
			return false, err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		if name := e.Name(); !strings.HasPrefix(name, "..") && !visible[name] {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return false, err
			}
		}
	}
	if old != "" && old != filepath.Base(ts) {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			return true, err
		}
	}
	return true, nil
}

// same reports whether dir holds exactly files, with their modes.
func same(dir string, files []reconcile.File) bool {
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		return nil
	})
	if err != nil || n != len(files) {
		return false
	}
	for _, f := range files {
		p := filepath.Join(dir, f.Path)
		info, err := os.Lstat(p)
		if err != nil || !info.Mode().IsRegular() || uint32(info.Mode().Perm()) != f.Mode&0o777 {
			return false
		}
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(b, f.Data) {
			return false
		}
	}
	return true
}

// errOutside: a path that leads out of its volume (through a symlink a
// container made).
var errOutside = errors.New("leads outside its volume")

// MkdirBeneath makes the directories of sub (relative, clean) below
// root, one at a time, refusing any symlink on the way (O_NOFOLLOW):
// a container that writes a symlink into a volume cannot make the
// agent create directories elsewhere.
func MkdirBeneath(root, sub string) error {
	if !reconcile.CleanSubPath(sub) {
		return fmt.Errorf("%q: %w", sub, errOutside)
	}
	fd, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	for _, name := range strings.Split(sub, "/") {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return fmt.Errorf("mkdir %s in %s: %w", name, root, err)
		}
		next, err := unix.Openat(fd, name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return fmt.Errorf("%q: %w", sub, errOutside)
		}
		if err != nil {
			return err
		}
		fd = next
	}
	unix.Close(fd)
	return nil
}

// Resolve returns the host path of sub inside the directory dir, with
// symlinks followed and checked to stay inside dir: what a subPath mount
// binds. A sub that does not exist is made a directory, as the kubelet
// makes it (MkdirBeneath). The result may change after the check (a
// container that rewrites a symlink in a volume it shares races the
// mount): the kubelet has the same window without its safe-open code.
func Resolve(dir, sub string) (string, error) {
	if !reconcile.CleanSubPath(sub) {
		return "", fmt.Errorf("subPath %q: %w", sub, errOutside)
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	p, err := filepath.EvalSymlinks(filepath.Join(root, sub))
	if errors.Is(err, fs.ErrNotExist) {
		if err := MkdirBeneath(root, sub); err != nil {
			return "", fmt.Errorf("subPath %w", err)
		}
		p, err = filepath.EvalSymlinks(filepath.Join(root, sub))
	}
	if err != nil {
		return "", err
	}
	if p != root && !strings.HasPrefix(p, root+string(filepath.Separator)) {
		return "", fmt.Errorf("subPath %q: %w", sub, errOutside)
	}
	return p, nil
}

// chgrp gives p to group gid (nil: leaves it), without following a
// symlink.
func chgrp(p string, gid *int64) error {
	if gid == nil {
		return nil
	}
	return os.Lchown(p, -1, int(*gid))
}
