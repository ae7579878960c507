package fsops

import (
	"encoding/binary"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FIEMAP's ABI (linux/fiemap.h), which x/sys/unix does not define.
const (
	fsIocFiemap       = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapFlagSync    = 0x1
	fiemapExtentLast  = 0x1
	fiemapUnwritten   = 0x800
	fiemapHeadSize    = 32
	fiemapExtentSize  = 56
	fiemapExtentBatch = 64
)

// HoldsNoData says whether every byte of the file at path reads as zero
// because none was ever written: each extent is a hole or is allocated
// but unwritten (what fallocate(2) leaves). A file that was written to,
// even with zeros, does not qualify. A file system without FIEMAP
// (tmpfs) cannot prove it, and gets false.
func HoldsNoData(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, fiemapHeadSize+fiemapExtentBatch*fiemapExtentSize)
	for start := uint64(0); ; {
		clear(buf)
		binary.NativeEndian.PutUint64(buf[0:], start)
		binary.NativeEndian.PutUint64(buf[8:], ^uint64(0)-start)
		binary.NativeEndian.PutUint32(buf[16:], fiemapFlagSync) // delayed allocations first
		binary.NativeEndian.PutUint32(buf[24:], fiemapExtentBatch)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			if errno == unix.EOPNOTSUPP || errno == unix.ENOTTY {
				return false, nil
			}
			return false, &os.PathError{Op: "ioctl(FS_IOC_FIEMAP)", Path: path, Err: errno}
		}
		n := binary.NativeEndian.Uint32(buf[20:])
		if n == 0 {
			return true, nil
		}
		for i := range n {
			e := buf[fiemapHeadSize+i*fiemapExtentSize:]
			flags := binary.NativeEndian.Uint32(e[40:])
			if flags&fiemapUnwritten == 0 {
				return false, nil
			}
			if flags&fiemapExtentLast != 0 {
				return true, nil
			}
			start = binary.NativeEndian.Uint64(e[0:]) + binary.NativeEndian.Uint64(e[16:])
		}
	}
}
