package volumes

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A claim's size, enforced where the node's filesystem can hold a
// directory to a size, as the kubelet's local volumes and the
// local-path provisioner do with project quotas:
//
//   - btrfs with quotas enabled (`btrfs quota enable MOUNT`): the volume
//     is a subvolume of its own, its qgroup limited (max_rfer) to the
//     request;
//   - XFS mounted with prjquota, ext4 with the project feature mounted
//     with prjquota: the volume's directory gets a project ID of its own
//     (inherited by what is made in it) and the project a block hard
//     limit (quotactl_fd, Linux 5.14).
//
// Anywhere else (or a kernel built without quota support), the request
// is advisory: the volume is a plain directory and `get pvc` says so.
// A write past an enforced limit fails with EDQUOT ("Disk quota
// exceeded"), the way a full disk fails it.

// makeVolume makes dir, the directory of a claim's volume, and holds it
// to limit bytes where the filesystem allows; it reports whether it
// does. Why a limit could not be set is returned with a nil error (the
// volume is usable, its size advisory).
func makeVolume(dir, uid string, limit int64) (enforced bool, why string, err error) {
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return false, "", err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(parent, &st); err != nil {
		return false, "", err
	}
	if st.Type == unix.BTRFS_SUPER_MAGIC {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			if err := btrfsSubvolume(parent, filepath.Base(dir)); err != nil {
				return false, "", err
			}
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			return false, "", err
		}
		// A qgroup limit set from a plain directory would limit the
		// subvolume around it (the host's filesystem): only a volume
		// made as a subvolume of its own is limited.
		if !isSubvolume(dir) {
			return false, "the volume was made as a plain directory (before this agent made subvolumes): its size is not enforced", nil
		}
		if err := btrfsLimit(dir, limit); err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	}
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return false, "", err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return false, "", err
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) > 0 {
		if id, ok := projectOf(dir); !ok || id != ProjectID(uid) {
			// Files made before the project ID was set stay outside it.
			return false, "the volume holds files made before its project ID was set: its size is not enforced", nil
		}
	}
	if err := projectLimit(dir, ProjectID(uid), limit); err != nil {
		return false, err.Error(), nil
	}
	return true, "", nil
}

// ProjectID is the project quota ID of the volume of the claim whose
// UID is uid: an FNV-1a hash of it, in [1<<20, 1<<31), away from the
// small IDs that /etc/projects files hand out by hand.
func ProjectID(uid string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(uid))
	return 1<<20 + h.Sum32()%(1<<31-1<<20)
}

// The Linux ABI for project quotas (linux/fs.h, linux/quota.h).
const (
	fsIOCFSGetXattr      = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIOCFSSetXattr      = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjInherit   = 0x00000200
	prjQuota             = 2
	qSetQuota            = 0x800008
	qGetQuota            = 0x800007
	qifBLimits           = 1
	quotaBlockSize       = 1024       // if_dqblk's block limits are in KiB
	sysQuotactlFd        = 443        // the same number on every architecture
	btrfsIOCSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	btrfsIOCQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	btrfsLimitMaxRfer    = 1
)

// fsxattr is struct fsxattr.
type fsxattr struct {
	xflags, extsize, nextents, projid, cowextsize uint32
	pad                                           [8]byte
}

// dqblk is struct if_dqblk.
type dqblk struct {
	bhardlimit, bsoftlimit, curspace, ihardlimit, isoftlimit, curinodes, btime, itime uint64
	valid                                                                             uint32
	_                                                                                 uint32
}

// projectLimit gives dir project ID id, inherited by what is made in
// it, and limits the project to limit bytes; the limit is read back, so
// a filesystem that takes the call without keeping it does not count as
// enforcing.
func projectLimit(dir string, id uint32, limit int64) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	fd := f.Fd()
	var x fsxattr
	if err := ioctl(fd, fsIOCFSGetXattr, unsafe.Pointer(&x)); err != nil {
		return fmt.Errorf("the filesystem has no project IDs (XFS, or ext4 with the project feature): %w", err)
	}
	x.projid, x.xflags = id, x.xflags|fsXflagProjInherit
	if err := ioctl(fd, fsIOCFSSetXattr, unsafe.Pointer(&x)); err != nil {
		return fmt.Errorf("the filesystem gives directories no project ID (XFS, ext4 with the project feature, or btrfs with quotas enable a limit): %w", err)
	}
	blocks := uint64((limit + quotaBlockSize - 1) / quotaBlockSize)
	q := dqblk{bhardlimit: blocks, bsoftlimit: blocks, valid: qifBLimits}
	if err := quotactl(fd, qSetQuota, id, unsafe.Pointer(&q)); err != nil {
		return fmt.Errorf("no project quota (mount with prjquota, on a kernel with quota support): %w", err)
	}
	var back dqblk
	if err := quotactl(fd, qGetQuota, id, unsafe.Pointer(&back)); err != nil || back.bhardlimit != blocks {
		return fmt.Errorf("the project quota did not hold (read back %d KiB, %v)", back.bhardlimit, err)
	}
	return nil
}

// isSubvolume reports whether dir is the root of a btrfs subvolume
// (its inode number is BTRFS_FIRST_FREE_OBJECTID, 256).
func isSubvolume(dir string) bool {
	var st unix.Stat_t
	return unix.Stat(dir, &st) == nil && st.Ino == 256
}

// projectOf is the project ID of dir, if the filesystem gives one.
func projectOf(dir string) (uint32, bool) {
	f, err := os.Open(dir)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var x fsxattr
	if err := ioctl(f.Fd(), fsIOCFSGetXattr, unsafe.Pointer(&x)); err != nil {
		return 0, false
	}
	return x.projid, true
}

// btrfsVolArgs is struct btrfs_ioctl_vol_args.
type btrfsVolArgs struct {
	fd   int64
	name [4088]byte
}

// btrfsSubvolume makes subvolume name in directory parent.
func btrfsSubvolume(parent, name string) error {
	f, err := os.Open(parent)
	if err != nil {
		return err
	}
	defer f.Close()
	var args btrfsVolArgs
	copy(args.name[:len(args.name)-1], name)
	if err := ioctl(f.Fd(), btrfsIOCSubvolCreate, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("make btrfs subvolume %s: %w", filepath.Join(parent, name), err)
	}
	return nil
}

// btrfsQgroupLimit is struct btrfs_ioctl_qgroup_limit_args.
type btrfsQgroupLimit struct {
	qgroupid                                  uint64
	flags, maxRfer, maxExcl, rsvRfer, rsvExcl uint64
}

// btrfsLimit limits the qgroup of subvolume dir to limit bytes
// referenced (ENOTCONN: quotas are not enabled on the filesystem).
func btrfsLimit(dir string, limit int64) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	args := btrfsQgroupLimit{flags: btrfsLimitMaxRfer, maxRfer: uint64(limit)} // qgroupid 0: dir's subvolume
	if err := ioctl(f.Fd(), btrfsIOCQgroupLimit, unsafe.Pointer(&args)); err != nil {
		if errors.Is(err, unix.ENOTCONN) {
			return errors.New("btrfs quotas are not enabled on the filesystem (btrfs quota enable MOUNT)")
		}
		return fmt.Errorf("limit the btrfs qgroup: %w", err)
	}
	return nil
}

func ioctl(fd uintptr, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// quotactl is quotactl_fd(2) on the project quota type.
func quotactl(fd uintptr, cmd uint32, id uint32, addr unsafe.Pointer) error {
	if _, _, errno := unix.Syscall6(sysQuotactlFd, fd, uintptr(cmd<<8|prjQuota), uintptr(id), uintptr(addr), 0, 0); errno != 0 {
		return errno
	}
	return nil
}
