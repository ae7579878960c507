package fsops

import (
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// FIFREEZE and FITHAW (linux/fs.h: _IOWR('X', 119, int) and
// _IOWR('X', 120, int)); x/sys/unix does not name them.
const (
	fiFreeze = 0xC0045877
	fiThaw   = 0xC0045878
)

// Freeze freezes the file system mounted at path (FIFREEZE): the kernel
// writes back what is dirty, commits the journal, and blocks every new
// write until Thaw, so what is on its device then is one instant of it.
// A freeze is kernel state, not the caller's: it outlives the process
// that made it. A file system already frozen answers EBUSY; one that
// cannot be frozen, EOPNOTSUPP (or EINVAL).
func Freeze(path string) error { return freezeIoctl("ioctl(FIFREEZE)", path, fiFreeze) }

// Thaw thaws the file system mounted at path (FITHAW). One that is not
// frozen answers EINVAL; ThawIfFrozen takes that for done.
func Thaw(path string) error { return freezeIoctl("ioctl(FITHAW)", path, fiThaw) }

// ThawIfFrozen thaws the file system at path if it is frozen, and reports
// whether it was.
func ThawIfFrozen(path string) (bool, error) {
	f, err := openRoot(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	return thawFile(f, path)
}

func freezeIoctl(op, path string, req uint) error {
	f, err := openRoot(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), req, 0); err != nil {
		return &os.PathError{Op: op, Path: path, Err: err}
	}
	return nil
}

// openRoot opens the mount root at path read-only: FIFREEZE and FITHAW
// need CAP_SYS_ADMIN, not a writable descriptor, and opening for writing
// could block on a frozen file system.
func openRoot(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// thawFile thaws the file system f is open on and reports whether it was
// frozen: one that is not answers EINVAL, which is done.
func thawFile(f *os.File, path string) (bool, error) {
	err := unix.IoctlSetInt(int(f.Fd()), fiThaw, 0)
	if errors.Is(err, unix.EINVAL) {
		return false, nil
	}
	if err != nil {
		return false, &os.PathError{Op: "ioctl(FITHAW)", Path: path, Err: err}
	}
	return true, nil
}

// FreezeHeld freezes the file system mounted at path, as Freeze does, and
// returns the thaw, made through the same open descriptor of the mount's
// root. The descriptor is checked first: path must be on device dev (the
// caller's loop device), else nothing is frozen and the error unwraps to
// ESTALE: a path checked, then unmounted before it was opened, shows
// whatever holds the bare directory (usually the node's root), which must
// never be frozen. The caller syncs the file system first (SyncFS), while
// its writers still run, so the freeze has little left to write back
// with every writer blocked. The descriptor keeps the mount busy until
// the thaw: an unmount meanwhile fails with EBUSY instead of waiting on
// the frozen file system, and the thaw reaches the file system whatever
// was mounted or unmounted at path since. The thaw may be called again,
// also at once from several goroutines: once it has thawed, it is done.
// A file system frozen already (by someone else) answers EBUSY.
func FreezeHeld(path string, dev uint64) (thaw func() error, err error) {
	f, err := openOn(path, dev)
	if err != nil {
		return nil, err
	}
	if err := unix.IoctlSetInt(int(f.Fd()), fiFreeze, 0); err != nil {
		f.Close()
		return nil, &os.PathError{Op: "ioctl(FIFREEZE)", Path: path, Err: err}
	}
	var mu sync.Mutex
	thawed := false
	return func() error {
		mu.Lock()
		defer mu.Unlock()
		if thawed {
			return nil
		}
		if _, err := thawFile(f, path); err != nil {
			return err // the descriptor stays open for a retry
		}
		thawed = true
		return f.Close()
	}, nil
}

// ThawOn thaws the file system mounted at path if it is on device dev and
// frozen, and reports whether it was frozen. A path on another device is
// left alone (ESTALE), as FreezeHeld does.
func ThawOn(path string, dev uint64) (bool, error) {
	f, err := openOn(path, dev)
	if err != nil {
		return false, err
	}
	defer f.Close()
	return thawFile(f, path)
}

// openOn opens the mount root at path (openRoot) and checks, on the open
// descriptor, that it is on device dev.
func openOn(path string, dev uint64) (*os.File, error) {
	f, err := openRoot(path)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Dev != dev {
		f.Close()
		return nil, &os.PathError{Op: "freeze", Path: path, Err: unix.ESTALE}
	}
	return f, nil
}
