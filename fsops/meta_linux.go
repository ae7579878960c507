package fsops

import (
	"bytes"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// OpenBeneath opens rel below the directory rootfd with openat2(2), letting
// the kernel refuse any path that would leave the root or pass through a
// symlink (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS). This is what keeps a
// hostile archive or a pod that swaps a directory for a symlink inside the
// volume: the guarantee is the kernel's, not a string check.
func OpenBeneath(rootfd int, rel string, flags int) (int, error) {
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(rootfd, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Mode:    0,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	return fd, nil
}

// ListXattrs reads every extended attribute of an open file, including
// security.capability and the POSIX ACLs (system.posix_acl_*). A file
// system without xattrs gives an empty map.
func ListXattrs(fd int) (map[string][]byte, error) {
	size, err := unix.Flistxattr(fd, nil)
	if err != nil {
		if err == unix.ENOTSUP || err == unix.EOPNOTSUPP {
			return nil, nil
		}
		return nil, &os.PathError{Op: "flistxattr", Path: "", Err: err}
	}
	if size == 0 {
		return nil, nil
	}
	buf := make([]byte, size)
	n, err := unix.Flistxattr(fd, buf)
	if err != nil {
		return nil, &os.PathError{Op: "flistxattr", Path: "", Err: err}
	}
	out := map[string][]byte{}
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		if len(name) == 0 {
			continue
		}
		vsize, err := unix.Fgetxattr(fd, string(name), nil)
		if err != nil {
			if err == unix.ENODATA {
				continue
			}
			return nil, &os.PathError{Op: "fgetxattr", Path: string(name), Err: err}
		}
		val := make([]byte, vsize)
		if vsize > 0 {
			if vsize, err = unix.Fgetxattr(fd, string(name), val); err != nil {
				return nil, &os.PathError{Op: "fgetxattr", Path: string(name), Err: err}
			}
		}
		out[string(name)] = val[:vsize]
	}
	return out, nil
}

// SetXattrs sets extended attributes on an open file. Attributes the
// destination file system does not support are skipped, as cp -a does
// without --preserve=all.
func SetXattrs(fd int, attrs map[string][]byte) error {
	for name, val := range attrs {
		if err := unix.Fsetxattr(fd, name, val, 0); err != nil {
			if err == unix.ENOTSUP || err == unix.EOPNOTSUPP || (err == unix.EPERM && strings.HasPrefix(name, "trusted.")) {
				continue
			}
			return &os.PathError{Op: "fsetxattr", Path: name, Err: err}
		}
	}
	return nil
}

// Meta is the metadata a copy or restore preserves.
type Meta struct {
	Mode         uint32 // permission bits incl. setuid, setgid, sticky
	UID, GID     int
	Atime, Mtime unix.Timespec
}

// MetaOf extracts Meta from a stat.
func MetaOf(st *unix.Stat_t) Meta {
	return Meta{Mode: st.Mode & 0o7777, UID: int(st.Uid), GID: int(st.Gid), Atime: st.Atim, Mtime: st.Mtim}
}

// ApplyMeta sets owner, mode and times of the entry name in dirfd without
// following a symlink. Owner comes first because chown clears setuid and
// setgid; times come last because the other calls change ctime only. Mode
// is skipped on symlinks (Linux has no lchmod).
func ApplyMeta(dirfd int, name string, m Meta, symlink bool) error {
	if err := unix.Fchownat(dirfd, name, m.UID, m.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "fchownat", Path: name, Err: err}
	}
	if !symlink {
		if err := unix.Fchmodat(dirfd, name, m.Mode, 0); err != nil {
			return &os.PathError{Op: "fchmodat", Path: name, Err: err}
		}
	}
	ts := []unix.Timespec{m.Atime, m.Mtime}
	if err := unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: name, Err: err}
	}
	return nil
}

// sparseChunk is the unit in which zeros are looked for: a run of zeros
// this long becomes a hole.
const sparseChunk = 64 << 10

// WriteSparse writes size bytes from r into the open, empty file fd,
// leaving zero runs as holes, then sets its length. It reads a buffer at a
// time and writes each run of data with one pwrite. buf is reused across
// calls (a page fault costs more than the copy); 1 MiB suits it.
func WriteSparse(fd int, r io.Reader, size int64, buf []byte) error {
	if len(buf) < sparseChunk {
		buf = make([]byte, 1<<20)
	}
	var off int64
	full := true
	for off < size {
		n := min(int64(len(buf)), size-off)
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return err
		}
		f, err := WriteSparseAt(fd, buf[:n], off)
		if err != nil {
			return err
		}
		full = f
		off += n
	}
	if !full {
		if err := unix.Ftruncate(fd, size); err != nil {
			return &os.PathError{Op: "ftruncate", Path: "", Err: err}
		}
	}
	return nil
}

func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err != nil {
			return &os.PathError{Op: "pwrite", Path: "", Err: err}
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// WriteSparseAt writes data at offset base of the open file fd, leaving
// zero runs of at least sparseChunk bytes as holes and writing each run of
// data with one pwrite. It reports whether the last chunk was written: if
// not, the file ends in a hole and needs an ftruncate to get its length.
func WriteSparseAt(fd int, data []byte, base int64) (bool, error) {
	start := -1 // start of the pending data run
	full := true
	for off := 0; off < len(data); off += sparseChunk {
		end := min(off+sparseChunk, len(data))
		zero := allZero(data[off:end])
		switch {
		case !zero && start < 0:
			start = off
		case zero && start >= 0:
			if err := pwriteAll(fd, data[start:off], base+int64(start)); err != nil {
				return false, err
			}
			start = -1
		}
		full = !zero
	}
	if start >= 0 {
		if err := pwriteAll(fd, data[start:], base+int64(start)); err != nil {
			return false, err
		}
	}
	return full || len(data) == 0, nil
}

// ApplyMetaFD sets owner, mode and times on an open file. Owner and mode
// calls are skipped when the file already has them (a file root creates
// with the right mode needs neither), which matters when restoring
// millions of small files.
func ApplyMetaFD(fd int, m Meta, have *unix.Stat_t) error {
	if have == nil || int(have.Uid) != m.UID || int(have.Gid) != m.GID {
		if err := unix.Fchown(fd, m.UID, m.GID); err != nil {
			return &os.PathError{Op: "fchown", Path: "", Err: err}
		}
		have = nil // chown may have cleared setuid/setgid
	}
	if have == nil || have.Mode&0o7777 != m.Mode {
		if err := unix.Fchmod(fd, m.Mode); err != nil {
			return &os.PathError{Op: "fchmod", Path: "", Err: err}
		}
	}
	ts := []unix.Timespec{m.Atime, m.Mtime}
	if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
		return &os.PathError{Op: "utimensat", Path: "", Err: err}
	}
	return nil
}

// umask is the process's file creation mask, read once at start (reading
// it means setting it, which is only safe before other goroutines create
// files).
var umask = func() uint32 {
	m := unix.Umask(0)
	unix.Umask(m)
	return uint32(m)
}()

// CreatedMode is the mode a file created with perm really gets.
func CreatedMode(perm uint32) uint32 { return perm &^ umask & 0o777 }

// longPathChunk keeps each openat2 path well under PATH_MAX.
const longPathChunk = 2048

// OpenBeneathLong is OpenBeneath for paths of any length: a path longer
// than PATH_MAX is opened a piece at a time, each piece beneath the
// directory the previous one opened, so a 4,000-deep tree can be reached
// and still nothing outside the root.
func OpenBeneathLong(rootfd int, rel string, flags int) (int, error) {
	if len(rel) <= longPathChunk {
		return OpenBeneath(rootfd, rel, flags)
	}
	dirfd, owned := rootfd, false
	for len(rel) > longPathChunk {
		cut := strings.LastIndexByte(rel[:longPathChunk], '/')
		if cut <= 0 {
			if owned {
				unix.Close(dirfd)
			}
			return -1, &os.PathError{Op: "openat2", Path: rel[:64] + "...", Err: unix.ENAMETOOLONG}
		}
		fd, err := OpenBeneath(dirfd, rel[:cut], unix.O_RDONLY|unix.O_DIRECTORY)
		if owned {
			unix.Close(dirfd)
		}
		if err != nil {
			return -1, err
		}
		dirfd, owned, rel = fd, true, rel[cut+1:]
	}
	fd, err := OpenBeneath(dirfd, rel, flags)
	if owned {
		unix.Close(dirfd)
	}
	return fd, err
}

// PunchHole makes n bytes of the open file fd at off read as zeros, as a
// hole where the file system can punch one (the size is kept), else by
// writing zeros.
func PunchHole(fd int, off, n int64) error {
	err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if err == nil || (err != unix.EOPNOTSUPP && err != unix.ENOSYS) {
		if err != nil {
			return &os.PathError{Op: "fallocate(PUNCH_HOLE)", Path: "", Err: err}
		}
		return nil
	}
	zero := make([]byte, min(n, 1<<20))
	for n > 0 {
		c := min(n, int64(len(zero)))
		if err := pwriteAll(fd, zero[:c], off); err != nil {
			return err
		}
		off, n = off+c, n-c
	}
	return nil
}

// PwriteAll writes all of b at offset off of the open file fd.
func PwriteAll(fd int, b []byte, off int64) error { return pwriteAll(fd, b, off) }
