package fsops

import (
	"encoding/binary"
	"errors"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FIEMAP's ABI (linux/fiemap.h), which x/sys/unix does not define.
const (
	fsIocFiemap       = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapFlagSync    = 0x1
	fiemapExtentLast  = 0x1
	fiemapUnknown     = 0x2   // where the data is, is not known
	fiemapDelalloc    = 0x4   // not allocated yet
	fiemapEncoded     = 0x8   // compressed or encrypted: physical is not bytes
	fiemapNotAligned  = 0x100 // packed with other data
	fiemapInline      = 0x200 // in the file system's metadata
	fiemapTail        = 0x400 // packed with other files' tails
	fiemapUnwritten   = 0x800
	fiemapHeadSize    = 32
	fiemapExtentSize  = 56
	fiemapExtentBatch = 64
)

// fiemapExtent is one extent FIEMAP reports: logical and physical offsets
// in bytes, its length and its flags.
type fiemapExtent struct {
	logical, physical, length uint64
	flags                     uint32
}

// fiemap calls fn with each extent of f from start on, in order, until fn
// returns false or the last one. Delayed allocations are flushed first
// (FIEMAP_FLAG_SYNC), so what is reported is where the data is on disk.
// A file system without FIEMAP (tmpfs) is unix.EOPNOTSUPP or ENOTTY.
func fiemap(f *os.File, start uint64, fn func(fiemapExtent) bool) error {
	buf := make([]byte, fiemapHeadSize+fiemapExtentBatch*fiemapExtentSize)
	for {
		clear(buf)
		binary.NativeEndian.PutUint64(buf[0:], start)
		binary.NativeEndian.PutUint64(buf[8:], ^uint64(0)-start)
		binary.NativeEndian.PutUint32(buf[16:], fiemapFlagSync)
		binary.NativeEndian.PutUint32(buf[24:], fiemapExtentBatch)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			return &os.PathError{Op: "ioctl(FS_IOC_FIEMAP)", Path: f.Name(), Err: errno}
		}
		n := binary.NativeEndian.Uint32(buf[20:])
		if n == 0 {
			return nil
		}
		for i := range n {
			b := buf[fiemapHeadSize+i*fiemapExtentSize:]
			e := fiemapExtent{
				logical:  binary.NativeEndian.Uint64(b[0:]),
				physical: binary.NativeEndian.Uint64(b[8:]),
				length:   binary.NativeEndian.Uint64(b[16:]),
				flags:    binary.NativeEndian.Uint32(b[40:]),
			}
			if !fn(e) || e.flags&fiemapExtentLast != 0 {
				return nil
			}
			start = e.logical + e.length
		}
	}
}

// noFiemap reports whether err says the file system has no FIEMAP.
func noFiemap(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY)
}

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
	empty := true
	err = fiemap(f, 0, func(e fiemapExtent) bool {
		empty = e.flags&fiemapUnwritten != 0
		return empty
	})
	if noFiemap(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return empty, nil
}

// SharedRanges lists the ranges between start and size where files a and
// b are the same blocks on disk: the same physical bytes at the same
// offset of each, as a reflink (FICLONE) leaves them on XFS and btrfs,
// until either file is written there. Those ranges hold the same bytes
// without reading them. Extents whose place on disk is not plain bytes
// (unknown, delayed, compressed, inline, packed) never count. A file
// system without FIEMAP shares nothing.
func SharedRanges(a, b *os.File, start, size int64) ([]Extent, error) {
	ma, err := mapExtents(a, start, size)
	if err != nil {
		return nil, err
	}
	mb, err := mapExtents(b, start, size)
	if err != nil {
		return nil, err
	}
	return shared(ma.plain, mb.plain, start, size), nil
}

// extentMap is what FIEMAP says of a file's range: where it holds data,
// and its extents whose physical offsets are the data's own bytes. ok is
// false where the file system has no FIEMAP.
type extentMap struct {
	ok    bool
	data  []Extent
	plain []fiemapExtent
}

// mapExtents maps f from start to size with FIEMAP. Unwritten extents
// read as zeros, as holes do, once delayed writes are flushed (which
// FIEMAP_FLAG_SYNC does first): they are no data. FIEMAP answers in a few
// calls where SEEK_DATA/SEEK_HOLE takes one per extent, and those cost
// about 150 us each on a reflinked XFS image.
func mapExtents(f *os.File, start, size int64) (extentMap, error) {
	const notPlain = fiemapUnknown | fiemapDelalloc | fiemapEncoded | fiemapNotAligned | fiemapInline | fiemapTail
	m := extentMap{ok: true}
	err := fiemap(f, uint64(start), func(e fiemapExtent) bool {
		if e.logical >= uint64(size) {
			return false
		}
		if e.flags&fiemapUnwritten == 0 {
			lo := max(int64(e.logical), start)
			hi := min(int64(e.logical+e.length), size)
			if k := len(m.data) - 1; k >= 0 && m.data[k].Offset+m.data[k].Length == lo {
				m.data[k].Length += hi - lo
			} else {
				m.data = append(m.data, Extent{lo, hi - lo})
			}
		}
		if e.flags&notPlain == 0 {
			m.plain = append(m.plain, e)
		}
		return true
	})
	if noFiemap(err) {
		return extentMap{}, nil
	}
	return m, err
}

// shared is where the plain extents of two files are the same bytes on
// disk at the same offset, between start and size.
func shared(ea, eb []fiemapExtent, start, size int64) []Extent {
	var out []Extent
	for i, j := 0, 0; i < len(ea) && j < len(eb); {
		x, y := ea[i], eb[j]
		lo := max(x.logical, y.logical, uint64(start))
		hi := min(x.logical+x.length, y.logical+y.length, uint64(size))
		// The same place on disk for the same offset, and both written
		// or both unwritten (reading as zeros).
		if lo < hi && x.physical+(lo-x.logical) == y.physical+(lo-y.logical) && x.flags&fiemapUnwritten == y.flags&fiemapUnwritten {
			if k := len(out) - 1; k >= 0 && out[k].Offset+out[k].Length == int64(lo) {
				out[k].Length += int64(hi - lo)
			} else {
				out = append(out, Extent{int64(lo), int64(hi - lo)})
			}
		}
		if x.logical+x.length <= y.logical+y.length {
			i++
		} else {
			j++
		}
	}
	return out
}
