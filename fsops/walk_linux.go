package fsops

import (
	"errors"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// OpenDirAt opens the directory name inside dirfd without following a
// symlink: if a pod swapped the directory for a symlink the open fails with
// ELOOP or ENOTDIR instead of leaving the tree.
func OpenDirAt(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "openat", Path: name, Err: err}
	}
	return fd, nil
}

// ReadDirNames lists the names in an open directory, without "." and "..".
// It reads through a duplicate, so fd keeps its own offset and stays open.
func ReadDirNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, &os.PathError{Op: "dup", Path: "", Err: err}
	}
	if _, err := unix.Seek(dup, 0, io.SeekStart); err != nil {
		unix.Close(dup)
		return nil, &os.PathError{Op: "seek", Path: "", Err: err}
	}
	f := os.NewFile(uintptr(dup), "")
	defer f.Close()
	return f.Readdirnames(-1)
}

// walkDir calls fn for every entry below the open directory fd, depth first,
// with fstatat(AT_SYMLINK_NOFOLLOW) information. Subdirectories are opened
// with OpenDirAt. It closes fd.
func walkDir(fd int, path string, fn func(dirfd int, name, path string, st *unix.Stat_t) error) error {
	defer unix.Close(fd)
	names, err := ReadDirNames(fd)
	if err != nil {
		return err
	}
	for _, name := range names {
		var st unix.Stat_t
		p := filepath.Join(path, name)
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				continue // removed while we walked
			}
			return &os.PathError{Op: "fstatat", Path: p, Err: err}
		}
		if err := fn(fd, name, p, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			sub, err := OpenDirAt(fd, name)
			if err != nil {
				return err
			}
			if err := walkDir(sub, p, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// RemoveAll removes path and everything below it, working
// fd-relative and without following symlinks, so a
// symlink inside a volume can never make the driver delete outside it.
// A missing entry is not an error.
func RemoveAll(path string) error {
	parent, name := filepath.Split(filepath.Clean(path))
	pfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: parent, Err: err}
	}
	defer unix.Close(pfd)
	return removeAt(pfd, name, path)
}

// RemoveAllDurable is RemoveAll whose removal is durable when it returns:
// the parent directory is fsynced, through the descriptor the removal
// went through, so a power loss after it cannot bring the tree back (a
// record dropped after it would otherwise leave the data owned by
// nothing).
func RemoveAllDurable(path string) error {
	parent, name := filepath.Split(filepath.Clean(path))
	pfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: parent, Err: err}
	}
	defer unix.Close(pfd)
	if err := removeAt(pfd, name, path); err != nil {
		return err
	}
	if err := unix.Fsync(pfd); err != nil {
		return &os.PathError{Op: "fsync", Path: parent, Err: err}
	}
	return nil
}

func removeAt(dirfd int, name, path string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return &os.PathError{Op: "unlinkat", Path: path, Err: err}
	}
	fd, err := OpenDirAt(dirfd, name)
	if err != nil {
		return err
	}
	names, err := ReadDirNames(fd)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n, filepath.Join(path, n)); err != nil {
				break
			}
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return &os.PathError{Op: "unlinkat", Path: path, Err: err}
	}
	return nil
}
