package fsops

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EXT4_IOC_RESIZE_FS (fs/ext4/ext4.h: _IOW('f', 16, __u64)).
const ext4ResizeFS = 0x40086610

// GrowExt4 grows the ext4 file system mounted at path, online, to blocks
// blocks of its block size (EXT4_IOC_RESIZE_FS), once its device has
// grown (a loop device: loop.Resize after the backing file grew). The
// kernel adds the new block groups while the file system stays in use.
func GrowExt4(path string, blocks uint64) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), ext4ResizeFS, uintptr(unsafe.Pointer(&blocks))); errno != 0 {
		return &os.PathError{Op: "ioctl(EXT4_IOC_RESIZE_FS)", Path: path, Err: errno}
	}
	return nil
}

// xfsGrowFSData is XFS_IOC_FSGROWFSDATA, _IOW('X', 110, struct
// xfs_growfs_data): 16 bytes (newblocks, imaxpct, padding).
const xfsGrowFSData = 0x4010586e

// xfsGeometryV1 is XFS_IOC_FSGEOMETRY_V1, _IOR('X', 100, struct
// xfs_fsop_geom_v1): 112 bytes, sb_imax_pct at 28.
const xfsGeometryV1 = 0x80705864

// xfsGrowData is struct xfs_growfs_data.
type xfsGrowData struct {
	NewBlocks uint64
	ImaxPct   uint32
	_         uint32
}

// xfsGeometry is what XFS_IOC_FSGEOMETRY_V1 says of the XFS open as f (a
// directory of it): data blocks, the groups' length and imaxpct, as the
// kernel has them (the superblock on the device may lag behind a growth).
// The struct's fields are in the CPU's order: agblocks at 8, imaxpct at
// 28, datablocks at 32.
func xfsGeometry(f *os.File) (blocks uint64, agBlocks, imaxPct uint32, err error) {
	var geo [112]byte
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), xfsGeometryV1, uintptr(unsafe.Pointer(&geo[0]))); errno != 0 {
		return 0, 0, 0, &os.PathError{Op: "ioctl(XFS_IOC_FSGEOMETRY_V1)", Path: f.Name(), Err: errno}
	}
	return *(*uint64)(unsafe.Pointer(&geo[32])), *(*uint32)(unsafe.Pointer(&geo[8])), *(*uint32)(unsafe.Pointer(&geo[28])), nil
}

// GrowXFS grows the XFS mounted at path to blocks of its block size
// (XFS_IOC_FSGROWFSDATA), once its device has grown; the kernel adds the
// groups (and leaves out a tail too short for one) while the file system
// stays in use. Growing to the size it has is no change. It needs
// CAP_SYS_ADMIN (not ext4's CAP_SYS_RESOURCE).
func GrowXFS(path string, blocks uint64) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// The call also sets the share of space inodes may take: pass the one
	// the file system has (0 would lift the limit).
	_, _, pct, err := xfsGeometry(f)
	if err != nil {
		return err
	}
	in := xfsGrowData{NewBlocks: blocks, ImaxPct: pct}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), xfsGrowFSData, uintptr(unsafe.Pointer(&in))); errno != 0 {
		return &os.PathError{Op: "ioctl(XFS_IOC_FSGROWFSDATA)", Path: path, Err: errno}
	}
	return nil
}

// XFSGeometry is what the XFS mounted at path says of its size: its data
// blocks and its groups' length, as the kernel has them.
func XFSGeometry(path string) (blocks uint64, agBlocks uint32, err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	blocks, agBlocks, _, err = xfsGeometry(f)
	return blocks, agBlocks, err
}
