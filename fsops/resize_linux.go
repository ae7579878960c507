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
