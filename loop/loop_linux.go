package loop

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	losetup "github.com/freddierice/go-losetup/v2"
	"golang.org/x/sys/unix"
)

// Device is an attached loop device.
type Device struct {
	Number int
	// Rdev is the device number (major 7 by default), what a bind-mounted
	// device node shows in st_rdev.
	Rdev uint64
	// ReadOnly is set for a device bound with LO_FLAGS_READ_ONLY.
	ReadOnly bool
	// DirectIO is set for a device Attach bound with direct I/O, and for
	// one List found with it.
	DirectIO bool
}

// Path is the device node, /dev/loopN.
func (d Device) Path() string { return losetup.New(uint64(d.Number), os.O_RDWR).Path() }

// Options for Attach.
type Options struct {
	ReadOnly bool
	// Autoclear detaches the device when its last user closes it.
	Autoclear bool
	// BlockSize is the device's logical block size (512 when 0). Direct
	// I/O needs it no smaller than the backing file's direct I/O
	// alignment, which XFS raises to its block size for a file that
	// shares blocks (a reflinked copy).
	BlockSize uint32
	// DirectIO binds the device with direct I/O (see SetDirectIO) in the
	// same call, which spares the second queue freeze of a
	// LOOP_SET_DIRECT_IO after it (about 18 ms on this runner). A backing
	// file system that cannot do it leaves the device buffered:
	// Device.DirectIO says which it got.
	DirectIO bool
}

// attachRetries bounds the race for a free device: another process (or
// goroutine) may configure the device LOOP_CTL_GET_FREE just returned.
const attachRetries = 16

// noConfigure caches that LOOP_CONFIGURE is missing (kernel <5.8).
var noConfigure atomic.Bool

// Attach binds the file at backing to a free loop device. If any step
// fails, everything done so far is undone: no device is left bound.
func Attach(backing string, opts Options) (Device, error) {
	flags := os.O_RDWR
	if opts.ReadOnly {
		flags = os.O_RDONLY
	}
	file, err := os.OpenFile(backing, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return Device{}, err
	}
	defer file.Close()
	return AttachFile(file, opts)
}

// AttachFile binds file, open as opts.ReadOnly says, to a free loop
// device: for a backing file opened in a way of the caller's (one whose
// writes leave its times alone, fsops.OpenUntimed). The device keeps its
// own reference; the caller closes file. Its name is the device's
// recorded backing file.
func AttachFile(file *os.File, opts Options) (Device, error) {
	backing := file.Name()
	flags := os.O_RDWR
	if opts.ReadOnly {
		flags = os.O_RDONLY
	}
	ctl, err := os.OpenFile(losetup.LoopControlPath, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return Device{}, err
	}
	defer ctl.Close()
	var loFlags uint32
	if opts.ReadOnly {
		loFlags |= unix.LO_FLAGS_READ_ONLY
	}
	if opts.Autoclear {
		loFlags |= unix.LO_FLAGS_AUTOCLEAR
	}
	var lastErr error
	for attempt := 0; attempt < attachRetries; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return Device{}, &os.PathError{Op: "ioctl(LOOP_CTL_GET_FREE)", Path: losetup.LoopControlPath, Err: err}
		}
		dev, err := configure(n, int(file.Fd()), backing, flags, loFlags, opts.BlockSize, opts.DirectIO)
		if err == nil {
			dev.ReadOnly = opts.ReadOnly
			return dev, nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return Device{}, err
		}
		// Someone else took device n between GET_FREE and our call.
		lastErr = err
		time.Sleep(time.Duration(rand.IntN(2000)+100) * time.Microsecond)
	}
	return Device{}, lastErr
}

func devPath(n int) string { return losetup.New(uint64(n), os.O_RDWR).Path() }

// configure binds fd to /dev/loopN, with direct I/O if dio and the backing
// file takes it.
func configure(n, fd int, backing string, openFlags int, loFlags, blockSize uint32, dio bool) (_ Device, retErr error) {
	path := devPath(n)
	devf, err := os.OpenFile(path, openFlags|unix.O_CLOEXEC, 0)
	if os.IsNotExist(err) {
		// Containers may have a /dev without the node the kernel just
		// made; create it.
		if err := unix.Mknod(path, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil && err != unix.EEXIST {
			return Device{}, &os.PathError{Op: "mknod", Path: path, Err: err}
		}
		devf, err = os.OpenFile(path, openFlags|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return Device{}, err
	}
	defer devf.Close()
	dfd := int(devf.Fd())
	var info unix.LoopInfo64
	info.Flags = loFlags
	copy(info.File_name[:], backing)

	if !noConfigure.Load() {
		cfg := unix.LoopConfig{Fd: uint32(fd), Info: info, Size: blockSize}
		if dio {
			cfg.Info.Flags |= unix.LO_FLAGS_DIRECT_IO
		}
		err := unix.IoctlLoopConfigure(dfd, &cfg)
		if err == unix.EINVAL && dio {
			// A kernel that refuses the flag rather than dropping it
			// where the backing file cannot: bound buffered.
			cfg.Info.Flags &^= unix.LO_FLAGS_DIRECT_IO
			err = unix.IoctlLoopConfigure(dfd, &cfg)
		}
		if err == nil {
			return deviceOf(devf, n, dio)
		}
		if err != unix.EINVAL && err != unix.ENOTTY {
			return Device{}, &os.PathError{Op: "ioctl(LOOP_CONFIGURE)", Path: path, Err: err}
		}
		noConfigure.Store(true)
	}
	// Old kernels: two calls, and the first must be undone if the second
	// fails.
	if err := unix.IoctlSetInt(dfd, unix.LOOP_SET_FD, fd); err != nil {
		return Device{}, &os.PathError{Op: "ioctl(LOOP_SET_FD)", Path: path, Err: err}
	}
	defer func() {
		if retErr != nil {
			_ = unix.IoctlSetInt(dfd, unix.LOOP_CLR_FD, 0)
		}
	}()
	if err := unix.IoctlLoopSetStatus64(dfd, &info); err != nil {
		return Device{}, &os.PathError{Op: "ioctl(LOOP_SET_STATUS64)", Path: path, Err: err}
	}
	if blockSize != 0 {
		if err := unix.IoctlSetInt(dfd, unix.LOOP_SET_BLOCK_SIZE, int(blockSize)); err != nil {
			return Device{}, &os.PathError{Op: "ioctl(LOOP_SET_BLOCK_SIZE)", Path: path, Err: err}
		}
	}
	if dio {
		// Refused (EINVAL) where the backing file cannot: buffered.
		_ = unix.IoctlSetInt(dfd, unix.LOOP_SET_DIRECT_IO, 1)
	}
	return deviceOf(devf, n, dio)
}

// deviceOf is the loop device open as f; where direct I/O was asked
// (dio), its status says whether the device got it.
func deviceOf(f *os.File, n int, dio bool) (Device, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Device{}, &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	d := Device{Number: n, Rdev: st.Rdev}
	if dio {
		info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
		if err != nil {
			return Device{}, &os.PathError{Op: "ioctl(LOOP_GET_STATUS64)", Path: f.Name(), Err: err}
		}
		d.DirectIO = info.Flags&unix.LO_FLAGS_DIRECT_IO != 0
	}
	return d, nil
}

// Find returns a writable loop device bound to the file at backing,
// matched by the file's device and inode (LOOP_GET_STATUS64), not by name.
func Find(backing string) (Device, bool, error) {
	devs, err := FindAll(backing)
	if err != nil {
		return Device{}, false, err
	}
	for _, d := range devs {
		if !d.ReadOnly {
			return d, true, nil
		}
	}
	return Device{}, false, nil
}

// FindAll returns every loop device bound to the file at backing (a file
// may be bound more than once, for example read-write and read-only).
func FindAll(backing string) ([]Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(backing, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: backing, Err: err}
	}
	all, err := List()
	if err != nil {
		return nil, err
	}
	var out []Device
	for _, b := range all {
		if b.BackingIno == st.Ino && b.BackingDev == st.Dev {
			out = append(out, b.Device)
		}
	}
	return out, nil
}

// Bound is a bound loop device and the identity of its backing file.
type Bound struct {
	Device
	BackingDev, BackingIno uint64
}

// List returns every bound loop device, in one pass over /sys/block, so a
// caller matching many files scans once.
func List() ([]Bound, error) {
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil, err
	}
	var out []Bound
	for _, e := range entries {
		num, ok := strings.CutPrefix(e.Name(), "loop")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(num)
		if err != nil {
			continue
		}
		// Unbound devices have no backing_file: skip them without
		// opening the device.
		bf, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err != nil || len(bf) == 0 {
			continue
		}
		info, err := losetup.New(uint64(n), os.O_RDONLY).GetInfo()
		if err != nil {
			continue // detached meanwhile
		}
		f, err := os.Open(devPath(n))
		if err != nil {
			return nil, err
		}
		d, err := deviceOf(f, n, false)
		f.Close()
		if err != nil {
			return nil, err
		}
		d.ReadOnly = info.Flags&unix.LO_FLAGS_READ_ONLY != 0
		d.DirectIO = info.Flags&unix.LO_FLAGS_DIRECT_IO != 0
		out = append(out, Bound{Device: d, BackingDev: info.Device, BackingIno: info.INode})
	}
	return out, nil
}

// Detach unbinds the device. If it is still open (mounted, or held by a
// process) the kernel detaches it when the last user closes it.
func Detach(d Device) error {
	f, err := os.OpenFile(d.Path(), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil {
		if err == unix.ENXIO {
			return nil // already unbound
		}
		return &os.PathError{Op: "ioctl(LOOP_CLR_FD)", Path: d.Path(), Err: err}
	}
	return nil
}

// Resize makes the device take the backing file's current size
// (LOOP_SET_CAPACITY), e.g. after the file grew.
func Resize(d Device) error {
	f, err := os.OpenFile(d.Path(), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return &os.PathError{Op: "ioctl(LOOP_SET_CAPACITY)", Path: d.Path(), Err: err}
	}
	return nil
}

// Size returns the device's size in bytes (BLKGETSIZE64).
func Size(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var size uint64
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); errno != 0 {
		return 0, &os.PathError{Op: "ioctl(BLKGETSIZE64)", Path: path, Err: errno}
	}
	return int64(size), nil
}

// Status reports the flags of a bound device (LO_FLAGS_READ_ONLY, ...).
func Status(d Device) (unix.LoopInfo64, error) {
	f, err := os.Open(d.Path())
	if err != nil {
		return unix.LoopInfo64{}, err
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return unix.LoopInfo64{}, &os.PathError{Op: "ioctl(LOOP_GET_STATUS64)", Path: d.Path(), Err: err}
	}
	return *info, nil
}

// SetDirectIO turns direct I/O on or off for a bound device
// (LOOP_SET_DIRECT_IO): its reads and writes reach the backing file with
// O_DIRECT, past the page cache of the file system holding it, so a
// volume's data is not cached twice (above the device and below it) and a
// flush of the device is a flush of the file. A backing file system that
// cannot do direct I/O, or whose block size the device's is below,
// refuses with EINVAL; the device stays as it was, buffered.
func SetDirectIO(d Device, on bool) error {
	f, err := os.OpenFile(d.Path(), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	arg := 0
	if on {
		arg = 1
	}
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_DIRECT_IO, arg); err != nil {
		return &os.PathError{Op: "ioctl(LOOP_SET_DIRECT_IO)", Path: d.Path(), Err: err}
	}
	return nil
}
