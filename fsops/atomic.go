package fsops

import (
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// WriteFileAtomic replaces path with data so that a crash at any instant
// leaves either the old content or the new one, never a mix or an empty
// file: write a temporary file in the same directory, fsync it, rename it
// over path, then fsync the directory so the rename itself is durable.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	s, err := StageFile(path, data, perm)
	if err != nil {
		return err
	}
	if err := publish(s.f, s.tmp, path); err != nil {
		s.Abort() // a failed fsync leaves the file open
		return err
	}
	return nil
}

// publish makes a fully written temporary file the file at path: fsync,
// close, rename, and an fsync of the directory so the rename survives a
// crash. The caller removes tmp if it fails.
func publish(f *os.File, tmp, path string) error {
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// RemoveDurable removes path and fsyncs its directory, so the removal
// survives a crash. A path that does not exist is not an error.
func RemoveDurable(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs a directory, making renames and removals in it durable.
func SyncDir(dir string) error {
	if dir == "" {
		dir = "."
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return &os.PathError{Op: "fsync", Path: dir, Err: err}
	}
	return nil
}

// SyncFile fsyncs the file at path (opened without following a symlink),
// making what was written to it durable.
func SyncFile(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return &os.PathError{Op: "fsync", Path: path, Err: err}
	}
	return nil
}

// SyncFS flushes the whole file system holding path with one syncfs(2),
// cheaper than an fsync per file after writing many files.
func SyncFS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return &os.PathError{Op: "syncfs", Path: path, Err: err}
	}
	return nil
}

// CreateDurable makes path hold what fill writes, so that path either
// exists complete and on disk or not at all: fill writes tmp, a file made
// exclusively (tmp must be on path's file system), which is fsynced,
// renamed to path, and the rename made durable with an fsync of path's
// directory. On any failure tmp is removed and path is untouched.
func CreateDurable(path, tmp string, perm os.FileMode, fill func(f *os.File) error) (retErr error) {
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, perm)
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := fill(f); err != nil {
		return err
	}
	return publish(f, tmp, path)
}

// FileSize returns the open file's size and the bytes its blocks occupy.
func FileSize(f *os.File) (size, allocated int64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, 0, &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	return st.Size, st.Blocks * 512, nil
}

// Staged is a complete file written under a temporary name beside the
// path it is meant for, not yet in place. A write-ahead log makes the
// change durable between StageFile and Place: the content, which may
// fail (a full disk), is written before the log entry, and the rename,
// which makes the change visible, comes after it.
type Staged struct {
	f         *os.File
	tmp, path string
}

// StageFile writes data to a new temporary file in path's directory, not
// synced. The file is then held open read-only: a descriptor opened for
// writing would make a remount of the file system read-only fail with
// EBUSY, and one opened now, before any writeback, still sees a writeback
// error when it is fsynced.
func StageFile(path string, data []byte, perm os.FileMode) (_ *Staged, retErr error) {
	dir, base := filepath.Split(path)
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return nil, err
	}
	if err := f.Chmod(perm); err != nil {
		return nil, err
	}
	ro, err := os.OpenFile(tmp, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		ro.Close()
		return nil, err
	}
	return &Staged{f: ro, tmp: tmp, path: path}, nil
}

// Place renames the staged file over its path, atomically but not
// durably, and hands over the open file: its Sync, through the descriptor
// that wrote it, reports a writeback error that a newly opened descriptor
// would not see. On failure the staged file is removed.
func (s *Staged) Place() (*os.File, error) {
	if err := os.Rename(s.tmp, s.path); err != nil {
		s.Abort()
		return nil, err
	}
	return s.f, nil
}

// Abort removes the staged file.
func (s *Staged) Abort() {
	s.f.Close()
	os.Remove(s.tmp)
}
