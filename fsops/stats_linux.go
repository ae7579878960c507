package fsops

import (
	"os"

	"golang.org/x/sys/unix"
)

// FSStats is the space and inode accounting of one file system.
type FSStats struct {
	TotalBytes, AvailableBytes int64
	// FreeBytes counts the blocks reserved for root too (f_bfree).
	FreeBytes               int64
	TotalInodes, FreeInodes int64
	// Type is the statfs(2) f_type magic (unix.XFS_SUPER_MAGIC, ...).
	Type int64
}

// Statfs reports the file system holding path, as statfs(2) sees it.
// AvailableBytes is what an unprivileged writer may still use (f_bavail).
func Statfs(path string) (FSStats, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return FSStats{}, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	return FSStats{
		TotalBytes:     int64(s.Blocks) * s.Bsize,
		AvailableBytes: int64(s.Bavail) * s.Bsize,
		FreeBytes:      int64(s.Bfree) * s.Bsize,
		TotalInodes:    int64(s.Files),
		FreeInodes:     int64(s.Ffree),
		Type:           s.Type,
	}, nil
}

// Usage is the space and inode count of a directory tree.
type Usage struct {
	Bytes  int64 // allocated bytes (st_blocks * 512), each inode once
	Inodes int64
}

// TreeUsage adds up the allocated bytes and inodes below dir, the directory
// itself included, walking fd-relative without following symlinks, so a
// volume's content cannot send the walk elsewhere. Hard-linked files count
// once.
func TreeUsage(dir string) (Usage, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Usage{}, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	var u Usage
	seen := map[[2]uint64]bool{}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return Usage{}, &os.PathError{Op: "fstat", Path: dir, Err: err}
	}
	u.Bytes += st.Blocks * 512
	u.Inodes++
	err = walkDir(fd, dir, func(dirfd int, name, path string, st *unix.Stat_t) error {
		if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			k := [2]uint64{st.Dev, st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		u.Bytes += st.Blocks * 512
		u.Inodes++
		return nil
	})
	return u, err
}
