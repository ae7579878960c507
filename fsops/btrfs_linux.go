package fsops

import (
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Btrfs has no project quotas; it limits subvolumes with quota groups. A
// directory volume on btrfs is therefore made a subvolume and given a
// qgroup limit on referenced bytes, which the kernel enforces with EDQUOT.
// Only ioctls: x/sys/unix has none of these numbers or structs, so they
// are declared here from <linux/btrfs.h>.

const (
	btrfsIocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	btrfsIocFsInfo       = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
	btrfsIocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	btrfsQgroupMaxRfer   = 1
	btrfsPathNameMax     = 4087
)

type btrfsVolArgs struct {
	Fd   int64
	Name [btrfsPathNameMax + 1]byte
}

type btrfsQgroupLimitArgs struct {
	QgroupID uint64
	Flags    uint64
	MaxRfer  uint64
	MaxExcl  uint64
	RsvRfer  uint64
	RsvExcl  uint64
}

type btrfsFsInfoArgs struct {
	MaxID      uint64
	NumDevices uint64
	FSID       [16]byte
	_          [1024 - 32]byte
}

func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer, op, path string) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); errno != 0 {
		return &os.PathError{Op: op, Path: path, Err: errno}
	}
	return nil
}

// IsBtrfs reports whether dir is on btrfs.
func IsBtrfs(dir string) bool {
	var s unix.Statfs_t
	return unix.Statfs(dir, &s) == nil && s.Type == unix.BTRFS_SUPER_MAGIC
}

// BtrfsQuotaEnabled says whether quota groups are on for the btrfs file
// system holding dir (the kernel lists them in sysfs only then). Turning
// them on is the operator's choice (btrfs quota enable): it costs every
// write some accounting.
func BtrfsQuotaEnabled(dir string) error {
	fd, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var info btrfsFsInfoArgs
	if err := ioctlPtr(fd, btrfsIocFsInfo, unsafe.Pointer(&info), "ioctl(BTRFS_IOC_FS_INFO)", dir); err != nil {
		return err
	}
	u := info.FSID
	fsid := fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	if _, err := os.Stat(filepath.Join("/sys/fs/btrfs", fsid, "qgroups")); err != nil {
		return &os.PathError{Op: "quota groups", Path: dir, Err: unix.ENOTSUP}
	}
	return nil
}

// CreateSubvolume makes path a new, empty btrfs subvolume. It can be
// removed like a directory once empty (RemoveAll does that).
func CreateSubvolume(path string) error {
	parent, name := filepath.Split(filepath.Clean(path))
	if len(name) > btrfsPathNameMax {
		return &os.PathError{Op: "subvolume create", Path: path, Err: unix.ENAMETOOLONG}
	}
	fd, err := openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var args btrfsVolArgs
	copy(args.Name[:], name)
	return ioctlPtr(fd, btrfsIocSubvolCreate, unsafe.Pointer(&args), "ioctl(BTRFS_IOC_SUBVOL_CREATE)", path)
}

// SetSubvolumeLimit limits the bytes the subvolume at path may reference
// (0 removes the limit).
func SetSubvolumeLimit(path string, bytes int64) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// qgroupid 0: the qgroup of the subvolume fd is in.
	args := btrfsQgroupLimitArgs{Flags: btrfsQgroupMaxRfer, MaxRfer: uint64(bytes)}
	if bytes == 0 {
		args.MaxRfer = ^uint64(0)
	}
	return ioctlPtr(fd, btrfsIocQgroupLimit, unsafe.Pointer(&args), "ioctl(BTRFS_IOC_QGROUP_LIMIT)", path)
}
