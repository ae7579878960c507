package fsops

import (
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// XFS's handle ioctls (fs/xfs/libxfs/xfs_fs.h): _IOWR('X', 105 and 107,
// struct xfs_fsop_handlereq), 56 bytes on 64-bit.
const (
	xfsPathToHandle = 0xc0385869
	xfsOpenByHandle = 0xc038586b
)

// xfsHandleReq is struct xfs_fsop_handlereq.
type xfsHandleReq struct {
	Fd       uint32
	_        uint32
	Path     uintptr
	Oflags   uint32
	_        uint32
	Ihandle  uintptr
	Ihandlen uint32
	_        uint32
	Ohandle  uintptr
	Ohandlen uintptr
}

// OpenUntimed opens the regular file at path for reading and writing so
// that writes through it leave its modification and change times alone,
// where its file system offers that: XFS opens a file by its handle
// (XFS_IOC_PATH_TO_HANDLE, then XFS_IOC_OPEN_BY_HANDLE) with
// FMODE_NOCMTIME, the "invisible I/O" xfs_fsr uses; it needs
// CAP_SYS_ADMIN. Why a loop device wants it: every write to its backing
// file would otherwise update the file's mtime, and the device's flush is
// a full fsync of the file, which then commits that inode to the pool's
// log once per clock tick on top of the flush itself. On any other file
// system it fails with EOPNOTSUPP, and the caller opens the file as
// usual.
func OpenUntimed(path string) (*os.File, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	if st.Type != unix.XFS_SUPER_MAGIC {
		return nil, &os.PathError{Op: "open by handle", Path: path, Err: unix.EOPNOTSUPP}
	}
	// The handle calls go to a directory of the same file system (open by
	// handle refuses any other descriptor).
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return nil, err
	}
	var handle [64]byte
	hlen := uint32(len(handle))
	req := xfsHandleReq{Path: uintptr(unsafe.Pointer(p)), Ohandle: uintptr(unsafe.Pointer(&handle[0])), Ohandlen: uintptr(unsafe.Pointer(&hlen))}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, dir.Fd(), xfsPathToHandle, uintptr(unsafe.Pointer(&req))); errno != 0 {
		return nil, &os.PathError{Op: "ioctl(XFS_IOC_PATH_TO_HANDLE)", Path: path, Err: errno}
	}
	open := xfsHandleReq{Oflags: unix.O_RDWR, Ihandle: uintptr(unsafe.Pointer(&handle[0])), Ihandlen: hlen}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, dir.Fd(), xfsOpenByHandle, uintptr(unsafe.Pointer(&open)))
	if errno != 0 {
		return nil, &os.PathError{Op: "ioctl(XFS_IOC_OPEN_BY_HANDLE)", Path: path, Err: errno}
	}
	// The kernel gives the new descriptor no close-on-exec flag.
	unix.CloseOnExec(int(fd))
	return os.NewFile(fd, path), nil
}
