// Package blank is what the in-process formatters share: a target's size,
// making all of it read as zeros without writing them, so a formatter
// writes only its metadata, and the defaults of a new file system's
// identity.
package blank

import (
	"crypto/rand"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Size is a file's length or a block device's size, and whether f is a
// regular file.
func Size(f *os.File) (int64, bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, false, err
	}
	if fi.Mode().IsRegular() {
		return fi.Size(), true, nil
	}
	if fi.Mode()&os.ModeDevice != 0 {
		n, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
		if err != nil {
			return 0, false, fmt.Errorf("reading the size of %s: %w", f.Name(), err)
		}
		return int64(n), false, nil
	}
	return 0, false, fmt.Errorf("%s is neither a regular file nor a block device", f.Name())
}

// Zero makes the whole of f read as zeros without writing them: a file's
// range is punched to a hole (fallocate(2)), a device's zeroed
// (BLKZEROOUT; on a loop device that allocates its backing file's blocks,
// so format an image file before attaching it, not the device after).
func Zero(f *os.File, size int64, regular bool) error {
	if regular {
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, size); err != nil {
			return fmt.Errorf("punching %s to a hole: %w", f.Name(), err)
		}
		return nil
	}
	r := [2]uint64{0, uint64(size)}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKZEROOUT, uintptr(unsafe.Pointer(&r))); errno != 0 {
		return fmt.Errorf("zeroing %s: %w", f.Name(), errno)
	}
	return nil
}

// Defaults fills what a caller left zero of a new file system: a random
// (version 4) UUID, so two never look alike to blkid or the kernel; a root
// directory of 0755, as mkfs makes it; the creation time, now. A root mode
// of more than permission bits is refused.
func Defaults(uuid *[16]byte, rootMode *os.FileMode, now *time.Time) error {
	if *uuid == ([16]byte{}) {
		if _, err := rand.Read(uuid[:]); err != nil {
			return err
		}
		uuid[6] = uuid[6]&0x0f | 0x40 // version 4
		uuid[8] = uuid[8]&0x3f | 0x80 // RFC 4122 variant
	}
	if *rootMode&^os.ModePerm != 0 {
		return fmt.Errorf("root mode %v: only permission bits", *rootMode)
	}
	if *rootMode == 0 {
		*rootMode = 0o755
	}
	if now.IsZero() {
		*now = time.Now()
	}
	return nil
}
