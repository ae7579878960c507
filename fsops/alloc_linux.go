package fsops

import (
	"os"

	"golang.org/x/sys/unix"
)

// CreateBackingFile makes a new file of exactly size bytes at path, its
// blocks reserved with fallocate(2) so writes to the volume cannot fail
// for lack of space later, and fsyncs it. A failure leaves no file behind.
func CreateBackingFile(path string, size int64) (retErr error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		f.Close()
		if retErr != nil {
			os.Remove(path)
		}
	}()
	if err := allocate(int(f.Fd()), path, size); err != nil {
		return err
	}
	return f.Sync()
}

// CreateSparseFile makes a new file at path of size bytes, none of them
// allocated yet (AllocateFile reserves them), and returns it open for
// writing. It is not fsynced: for a file that holds nothing yet, whose
// user makes it durable (SyncFile and SyncDir) before anything is written
// to it. A failure leaves no file behind.
func CreateSparseFile(path string, size int64) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Ftruncate(int(f.Fd()), size); err != nil {
		f.Close()
		os.Remove(path)
		return nil, &os.PathError{Op: "ftruncate", Path: path, Err: err}
	}
	return f, nil
}

// GrowFile extends the file at path to size bytes, allocated like
// CreateBackingFile. It never shrinks: a smaller size is an error
// wrapping EINVAL.
func GrowFile(path string, size int64) error { return grow(path, size, true) }

// GrowSparse is GrowFile without the allocation: the new bytes are a
// hole (an image whose file system allocates what it writes).
func GrowSparse(path string, size int64) error { return grow(path, size, false) }

func grow(path string, size int64, alloc bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if size < st.Size {
		return &os.PathError{Op: "grow", Path: path, Err: unix.EINVAL}
	}
	if alloc {
		if err := allocate(int(f.Fd()), path, size); err != nil {
			return err
		}
	} else if err := unix.Ftruncate(int(f.Fd()), size); err != nil {
		return &os.PathError{Op: "ftruncate", Path: path, Err: err}
	}
	return f.Sync()
}

// AllocateFile reserves blocks for all of an existing file's holes, up to
// size, without changing data (fallocate mode 0 leaves written and shared
// extents alone).
func AllocateFile(fd int, size int64) error {
	return allocate(fd, "", size)
}

func allocate(fd int, path string, size int64) error {
	if size <= 0 {
		return &os.PathError{Op: "fallocate", Path: path, Err: unix.EINVAL}
	}
	if err := unix.Fallocate(fd, 0, 0, size); err != nil {
		return &os.PathError{Op: "fallocate", Path: path, Err: err}
	}
	return nil
}
