package volumes

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAClaimsSizeIsEnforcedOnBtrfsWithQuotas: on a btrfs filesystem
// (a loop-mounted image) the volume is a subvolume; with quotas enabled
// its qgroup holds it to the request (a write past it fails with
// EDQUOT), without them the size is advisory and says why. On the
// test machine's own filesystem (ext4 without project quotas) it is
// advisory too. Removing the volume removes the subvolume.
func TestAClaimsSizeIsEnforcedOnBtrfsWithQuotas(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (loop mounts)")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("needs mkfs.btrfs (the Debian package btrfs-progs, which make deps installs)")
	}
	plain := filepath.Join(t.TempDir(), "u1", "data")
	enforced, why, err := makeVolume(plain, "u1", 1<<20)
	t.Logf("on the machine's filesystem: enforced %v: %s", enforced, why)
	if err != nil || !enforced && why == "" {
		t.Errorf("on the test machine's filesystem: enforced %v, why %q, err %v; want enforced, or advisory with a reason", enforced, why, err)
	}

	mnt := btrfsMount(t)
	dir := filepath.Join(mnt, "u2", "data")
	enforced, why, err = makeVolume(dir, "u2", 1<<20)
	if err != nil || enforced || !strings.Contains(why, "quota enable") {
		t.Fatalf("btrfs without quotas: enforced %v, why %q, err %v; want advisory, naming `btrfs quota enable`", enforced, why, err)
	}
	if out, err := exec.Command("btrfs", "quota", "enable", mnt).CombinedOutput(); err != nil {
		t.Fatalf("btrfs quota enable: %v %s", err, out)
	}
	dir = filepath.Join(mnt, "u3", "data")
	if enforced, why, err = makeVolume(dir, "u3", 1<<20); err != nil || !enforced {
		t.Fatalf("btrfs with quotas: enforced %v, why %q, err %v; want enforced", enforced, why, err)
	}
	if info, err := os.Stat(dir); err != nil || info.Mode().Perm() != 0o777 {
		t.Errorf("the volume: %v %v, want a directory anyone may write", info, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "small"), bytes.Repeat([]byte("x"), 256<<10), 0o644); err != nil {
		t.Fatalf("256 KiB into a 1 MiB volume: %v", err)
	}
	err = writeSynced(filepath.Join(dir, "big"), 4<<20)
	t.Logf("4 MiB into the 1 MiB volume: %v", err)
	if !errors.Is(err, unix.EDQUOT) {
		t.Errorf("4 MiB into a 1 MiB volume: %v, want EDQUOT (disk quota exceeded)", err)
	}
	// A larger request: the limit follows.
	if enforced, _, err := makeVolume(dir, "u3", 16<<20); err != nil || !enforced {
		t.Fatalf("the limit raised: enforced %v, err %v", enforced, err)
	}
	if err := writeSynced(filepath.Join(dir, "big"), 4<<20); err != nil {
		t.Errorf("4 MiB into the volume raised to 16 MiB: %v", err)
	}
	if err := os.RemoveAll(filepath.Dir(dir)); err != nil {
		t.Errorf("remove the volume (a subvolume): %v", err)
	}
	// A volume an older agent made as a plain directory: no limit is set
	// (from a plain directory it would limit the whole filesystem).
	old := filepath.Join(mnt, "u4", "data")
	if err := os.MkdirAll(old, 0o777); err != nil {
		t.Fatal(err)
	}
	if enforced, why, err := makeVolume(old, "u4", 1<<20); err != nil || enforced || why == "" {
		t.Errorf("a plain directory on btrfs: enforced %v, why %q, err %v; want advisory", enforced, why, err)
	}
	if err := writeSynced(filepath.Join(mnt, "outside"), 4<<20); err != nil {
		t.Errorf("4 MiB outside any volume: %v (a limit reached the filesystem)", err)
	}
}

// writeSynced writes n bytes to path and syncs them (btrfs checks a
// qgroup's limit as the data is reserved and written back).
func writeSynced(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte("y"), 64<<10)
	for written := 0; written < n; written += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			return err
		}
	}
	return f.Sync()
}

// btrfsMount makes a btrfs filesystem in an image file, mounts it on a
// loop device and returns the mount point; it is unmounted at the end
// of the test.
func btrfsMount(t *testing.T) string {
	t.Helper()
	tmp := t.TempDir()
	img, mnt := filepath.Join(tmp, "btrfs.img"), filepath.Join(tmp, "mnt")
	if err := os.Truncate(img, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(256 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := exec.Command("mkfs.btrfs", "-q", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.btrfs: %v %s", err, out)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("mount a btrfs image on a loop device: %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", mnt, err, out)
		}
	})
	return mnt
}

func TestProjectIDsStayClearOfHandGivenOnes(t *testing.T) {
	seen := map[uint32]bool{}
	for _, uid := range []string{"", "a", "3f1c2a9e-0d4b-4a57-9a55-1f0f3c1b2d4e", "ffffffff-ffff-ffff-ffff-ffffffffffff"} {
		id := ProjectID(uid)
		if id < 1<<20 || id >= 1<<31 || seen[id] {
			t.Errorf("ProjectID(%q) = %d, want one of its own in [1<<20, 1<<31)", uid, id)
		}
		seen[id] = true
	}
}
