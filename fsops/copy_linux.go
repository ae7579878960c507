package fsops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// CopyMethod says how a file's data was copied.
type CopyMethod int

// The copy methods, cheapest first.
const (
	CopyReflink   CopyMethod = iota // FICLONE: blocks shared, metadata only
	CopyRange                       // copy_file_range over data extents
	CopyReadWrite                   // user-space read/write, zero blocks skipped
)

func (m CopyMethod) String() string {
	return [...]string{"reflink", "copy_file_range", "read/write"}[m]
}

// Fallbacks are taken only on these errnos: the kernel or file system says
// it cannot do this kind of copy, not that the copy went wrong.
func reflinkUnsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM)
}

func rangeUnsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) ||
		errors.Is(err, unix.EINVAL)
}

// copyProbe caches, per pair of devices, what the kernel refused, so a tree
// of a million files asks once, not a million times.
type copyProbe struct {
	noReflink, noRange atomic.Bool
}

// CopyFileData copies the first size bytes of the open file src into the
// empty open file dst by the cheapest means that works: a reflink, then
// copy_file_range over the extents SEEK_DATA/SEEK_HOLE report (so holes stay
// holes; a plain copy_file_range fills them on ext4), then read/write that
// skips zero blocks. buf is a scratch buffer for the last resort. The
// Progress ctx carries (WithProgress), if any, counts the bytes as they
// are copied; a done ctx stops the copy within a chunk (256 MiB or the
// scratch buffer) with its error: a copy under a freeze must end when the
// freeze's bound does.
func CopyFileData(ctx context.Context, dst, src int, size int64, buf []byte) (CopyMethod, error) {
	return (&copyProbe{}).copyData(ctx, dst, src, size, false, buf, ProgressFrom(ctx))
}

// copyData copies a file's data. dense says the file has no holes (its
// blocks cover its size), which spares the extent lookups: one
// copy_file_range does a small file.
func (p *copyProbe) copyData(ctx context.Context, dst, src int, size int64, dense bool, buf []byte, pr *Progress) (CopyMethod, error) {
	if size == 0 {
		return CopyRange, nil
	}
	if !p.noReflink.Load() {
		err := unix.IoctlFileClone(dst, src)
		if err == nil {
			pr.AddBytes(size)
			return CopyReflink, nil
		}
		if !reflinkUnsupported(err) {
			return 0, &os.PathError{Op: "ioctl(FICLONE)", Path: "", Err: err}
		}
		p.noReflink.Store(true)
	}
	if !p.noRange.Load() {
		var err error
		if dense {
			err = copyRange(ctx, dst, src, 0, size, pr)
		} else {
			err = copyExtents(ctx, dst, src, size, pr)
		}
		if err == nil {
			return CopyRange, nil
		}
		if !rangeUnsupported(err) {
			return 0, err
		}
		p.noRange.Store(true)
		if err := unix.Ftruncate(dst, 0); err != nil {
			return 0, &os.PathError{Op: "ftruncate", Path: "", Err: err}
		}
	}
	return CopyReadWrite, WriteSparse(dst, ProgressReader{ctxReader{ctx, io.NewSectionReader(fdReaderAt(src), 0, size)}, pr}, size, buf)
}

// ctxReader reads from r until ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

// fdReaderAt reads a descriptor it does not own with pread(2). It is not an
// *os.File on purpose: os.NewFile would attach a finalizer that closes the
// number when the wrapper is collected, by which time the caller may have
// closed it and the number may belong to another worker's file.
type fdReaderAt int

func (fd fdReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Pread(int(fd), p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, &os.PathError{Op: "pread", Path: "", Err: err}
		}
		if m == 0 {
			return n, io.EOF
		}
		n += m
	}
	return n, nil
}

// copyRange moves [off, end) with copy_file_range, at the same offsets,
// at most 256 MiB a call so that progress shows in a large file.
func copyRange(ctx context.Context, dst, src int, off, end int64, pr *Progress) error {
	for off < end {
		if err := ctx.Err(); err != nil {
			return err
		}
		woff := off
		n, err := unix.CopyFileRange(src, &off, dst, &woff, int(min(end-off, 256<<20)), 0)
		if err != nil {
			return &os.PathError{Op: "copy_file_range", Path: "", Err: err}
		}
		pr.AddBytes(int64(n))
		if n == 0 {
			return &os.PathError{Op: "copy_file_range", Path: "", Err: fmt.Errorf("source shrank during copy: %w", unix.EIO)}
		}
	}
	return nil
}

// copyExtents moves each data extent with copy_file_range, leaving holes.
func copyExtents(ctx context.Context, dst, src int, size int64, pr *Progress) error {
	exts, err := DataExtents(src, 0, size)
	if err != nil {
		return err
	}
	for _, e := range exts {
		if err := copyRange(ctx, dst, src, e.Offset, e.Offset+e.Length, pr); err != nil {
			return err
		}
	}
	if err := unix.Ftruncate(dst, size); err != nil {
		return &os.PathError{Op: "ftruncate", Path: "", Err: err}
	}
	return nil
}

// ReflinkSupported reports whether files in dir can share blocks
// (FICLONE works there: XFS with reflink=1, btrfs). It makes and removes
// two small files to find out.
func ReflinkSupported(dir string) bool {
	a, err := os.CreateTemp(dir, ".reflink-probe-")
	if err != nil {
		return false
	}
	defer os.Remove(a.Name())
	defer a.Close()
	if _, err := a.Write(make([]byte, 4096)); err != nil {
		return false
	}
	b, err := os.CreateTemp(dir, ".reflink-probe-")
	if err != nil {
		return false
	}
	defer os.Remove(b.Name())
	defer b.Close()
	return unix.IoctlFileClone(int(b.Fd()), int(a.Fd())) == nil
}
