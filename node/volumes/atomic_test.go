package volumes

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/starling-orchestrator/starling/node/reconcile"
)

// TestWriteSwapsFilesAtOnce: the files appear through ..data, an update
// replaces them in one rename (a reader that opened the old directory
// keeps reading it whole), removes names no longer projected, and a
// second write of the same files changes nothing.
func TestWriteSwapsFilesAtOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cfg")
	v1 := []reconcile.File{{Path: "app.conf", Data: []byte("color=blue\n"), Mode: 0o644}, {Path: "sub/key", Data: []byte("k1"), Mode: 0o400}, {Path: "gone", Data: []byte("x"), Mode: 0o644}}
	if changed, err := Write(dir, v1, nil); err != nil || !changed {
		t.Fatal(changed, err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	if read("app.conf") != "color=blue\n" || read("sub/key") != "k1" || read("gone") != "x" {
		t.Fatalf("first write: %q %q", read("app.conf"), read("sub/key"))
	}
	if info, _ := os.Stat(filepath.Join(dir, "sub/key")); info.Mode().Perm() != 0o400 {
		t.Fatalf("mode %v", info.Mode())
	}
	if target, _ := os.Readlink(filepath.Join(dir, "app.conf")); target != "..data/app.conf" {
		t.Fatalf("app.conf -> %q", target)
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	held, err := os.Open(filepath.Join(dir, old, "app.conf")) // a reader mid-update
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if changed, err := Write(dir, v1, nil); err != nil || changed {
		t.Fatalf("same files written again: changed %v %v", changed, err)
	}
	v2 := []reconcile.File{{Path: "app.conf", Data: []byte("color=green\n"), Mode: 0o644}, {Path: "sub/key", Data: []byte("k2"), Mode: 0o400}}
	if changed, err := Write(dir, v2, nil); err != nil || !changed {
		t.Fatal(changed, err)
	}
	if read("app.conf") != "color=green\n" || read("sub/key") != "k2" {
		t.Fatalf("after the update: %q %q", read("app.conf"), read("sub/key"))
	}
	if _, err := os.Lstat(filepath.Join(dir, "gone")); !os.IsNotExist(err) {
		t.Fatalf("a name no longer projected is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, old)); !os.IsNotExist(err) {
		t.Fatal("the old directory is left")
	}
	b := make([]byte, 64)
	if n, _ := held.Read(b); string(b[:n]) != "color=blue\n" {
		t.Fatalf("an open file of the old version reads %q", b[:n])
	}
	if _, err := Write(dir, []reconcile.File{{Path: "../escape", Data: nil, Mode: 0o644}}, nil); err == nil {
		t.Fatal("a path out of the volume was written")
	}
	if _, err := Write(dir, []reconcile.File{{Path: "..data", Data: nil, Mode: 0o644}}, nil); err == nil {
		t.Fatal("a path over ..data was written")
	}
}

// TestResolveStaysInsideItsVolume: a subPath binds what it names now
// (through the symlinks), makes a missing directory, and refuses one a
// symlink leads out of the volume.
func TestResolveStaysInsideItsVolume(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "v")
	Write(dir, []reconcile.File{{Path: "app.conf", Data: []byte("x"), Mode: 0o644}}, nil)
	p, err := Resolve(dir, "app.conf")
	if err != nil || filepath.Base(filepath.Dir(p)) == "v" {
		t.Fatalf("resolved to %q %v (want the file in the data directory)", p, err)
	}
	if p, err := Resolve(dir, "new/sub"); err != nil {
		t.Fatal(err)
	} else if info, err := os.Stat(p); err != nil || !info.IsDir() {
		t.Fatal("missing subPath not made a directory")
	}
	os.Symlink("/etc", filepath.Join(dir, "out"))
	if _, err := Resolve(dir, "out"); err == nil {
		t.Fatal("a symlink out of the volume was followed")
	}
	if _, err := Resolve(dir, "../x"); err == nil {
		t.Fatal("a .. path resolved")
	}
}

// TestResolveMakesNothingOutsideItsVolume: a missing subPath below a
// symlink a container planted (a -> a directory outside) is refused
// before any directory is made there.
func TestResolveMakesNothingOutsideItsVolume(t *testing.T) {
	base := t.TempDir()
	vol, outside := filepath.Join(base, "vol"), filepath.Join(base, "outside")
	os.MkdirAll(vol, 0o755)
	os.MkdirAll(outside, 0o755)
	os.Symlink(outside, filepath.Join(vol, "a"))
	if _, err := Resolve(vol, "a/x/y"); err == nil {
		t.Fatal("resolved a path through a symlink out of the volume")
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); !os.IsNotExist(err) {
		t.Fatalf("a directory was made outside the volume: %v", err)
	}
	if err := MkdirBeneath(vol, "b/c"); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(filepath.Join(vol, "b/c")); err != nil || !info.IsDir() {
		t.Fatal("MkdirBeneath made no directory")
	}
}

// TestWriteGivesFilesToTheFSGroup: with a pod's fsGroup, the projected
// files and their directories belong to that group.
func TestWriteGivesFilesToTheFSGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	dir := filepath.Join(t.TempDir(), "v")
	gid := int64(4321)
	if _, err := Write(dir, []reconcile.File{{Path: "a/b", Data: []byte("x"), Mode: 0o440}}, &gid); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a/b", "a"} {
		info, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := info.Sys().(*syscall.Stat_t); st.Gid != uint32(gid) {
			t.Errorf("%s: group %d, want %d", p, st.Gid, gid)
		}
	}
}
