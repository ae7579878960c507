package fsops

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// mountOptionFlags are the per-mount options a bind mount can carry. File
// system specific options (data=ordered, ...) make no sense for a bind mount
// and are refused by ParseMountOptions.
var mountOptionFlags = map[string]uintptr{
	"ro":          unix.MS_RDONLY,
	"rw":          0,
	"nosuid":      unix.MS_NOSUID,
	"nodev":       unix.MS_NODEV,
	"noexec":      unix.MS_NOEXEC,
	"noatime":     unix.MS_NOATIME,
	"nodiratime":  unix.MS_NODIRATIME,
	"relatime":    unix.MS_RELATIME,
	"strictatime": unix.MS_STRICTATIME,
	"sync":        unix.MS_SYNCHRONOUS,
	"dirsync":     unix.MS_DIRSYNC,
	"suid":        0,
	"dev":         0,
	"exec":        0,
	"atime":       0,
	"async":       0,
	"defaults":    0,
	"bind":        0,
}

// ReadOnly is the flag of a read-only mount, for BindMount.
const ReadOnly uintptr = unix.MS_RDONLY

// MakeMountPoint creates what a bind mount goes on: a directory, or an
// empty file for a block device, with its missing parents. What exists
// already is used as it is; a symlink in the last component is refused.
func MakeMountPoint(path string, dir bool) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	if dir {
		if err := os.Mkdir(path, 0o750); err != nil && !os.IsExist(err) {
			return err
		}
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

// ParseMountOptions turns mount option names (as in a CSI mount capability
// or fstab) into MS_* flags for a bind mount. An option a bind mount cannot
// honour is an error wrapping EINVAL, so a request is refused rather than
// silently mounted without it.
func ParseMountOptions(opts []string) (uintptr, error) {
	var flags uintptr
	for _, o := range opts {
		for _, part := range strings.Split(o, ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			f, ok := mountOptionFlags[part]
			if !ok {
				return 0, fmt.Errorf("mount option %q: %w", part, unix.EINVAL)
			}
			flags |= f
		}
	}
	return flags, nil
}

// openNoFollow opens path as an O_PATH handle, refusing a symlink as its last
// component. Mounting on /proc/self/fd/N of such a handle means the mount
// lands on exactly the inode that was checked, not on whatever a symlink
// swapped in between check and mount points to.
func openNoFollow(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		f.Close()
		return nil, &os.PathError{Op: "open", Path: path, Err: unix.ELOOP}
	}
	return f, nil
}

func procFD(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// BindMount bind-mounts source onto target and then applies flags (MS_RDONLY,
// MS_NOSUID, ...) with a bind remount, because the kernel ignores them on the
// first MS_BIND call. target must exist and must not be a symlink. If the
// remount fails the bind mount is undone, so a failure leaves nothing mounted.
func BindMount(source, target string, flags uintptr) (retErr error) {
	src, err := openNoFollow(source)
	if err != nil {
		return err
	}
	defer src.Close()
	tgt, err := openNoFollow(target)
	if err != nil {
		return err
	}
	defer tgt.Close()
	if err := unix.Mount(procFD(src), procFD(tgt), "", unix.MS_BIND, ""); err != nil {
		return &os.PathError{Op: "mount(MS_BIND)", Path: target, Err: err}
	}
	if flags == 0 {
		return nil
	}
	defer func() {
		if retErr != nil {
			_ = unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		}
	}()
	// Reopen: the earlier handle names the directory under the new mount.
	top, err := openNoFollow(target)
	if err != nil {
		return err
	}
	defer top.Close()
	if err := unix.Mount("", procFD(top), "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		return &os.PathError{Op: "mount(MS_REMOUNT)", Path: target, Err: err}
	}
	return nil
}

// MountDevice mounts the file system of type fstype on the block device
// dev at target (mount(2), not a bind), then nothing else: flags and data
// are the kernel's (MS_NOATIME, "errors=remount-ro"). target must exist
// and must not be a symlink; it is reached through an O_PATH handle, so a
// rename racing the call cannot redirect the mount.
func MountDevice(dev, target, fstype string, flags uintptr, data string) error {
	tgt, err := openNoFollow(target)
	if err != nil {
		return err
	}
	defer tgt.Close()
	if err := unix.Mount(dev, procFD(tgt), fstype, flags, data); err != nil {
		return &os.PathError{Op: "mount(" + fstype + ")", Path: target, Err: err}
	}
	return nil
}

// Unmount detaches the mount at target without following a symlink there.
// A target that is not a mount point gives an error wrapping EINVAL; one that
// does not exist, ENOENT.
func Unmount(target string) error {
	if err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW); err != nil {
		return &os.PathError{Op: "umount2", Path: target, Err: err}
	}
	return nil
}

// MountPoint is what the kernel says about the mount at a path.
type MountPoint struct {
	// Root is the path inside the mounted file system that is mounted here
	// (for a bind mount, the source directory relative to its file system).
	Root     string
	FSType   string
	Source   string
	ReadOnly bool
	// Options are the per-mount options (ro, nosuid, nodev, ...).
	Options []string
	// Dev and Ino identify the inode at the mount point's root; Rdev is the
	// device number when that inode is a device node (a bind-mounted block
	// device). They tell which volume a mount shows without string tricks.
	Dev, Ino, Rdev uint64
}

// HasOption reports whether the mount carries the per-mount option name.
func (m *MountPoint) HasOption(name string) bool {
	for _, o := range m.Options {
		if o == name {
			return true
		}
	}
	return false
}

// GetMountPoint returns the topmost mount at path, or nil (and no error) if
// path is not a mount point. The answer comes from /proc/self/mountinfo via
// moby/sys/mountinfo; the identity of the mounted inode from fstat of an
// O_PATH handle that does not follow a symlink.
func GetMountPoint(path string) (*MountPoint, error) {
	real, err := ResolveParent(path)
	if err != nil {
		return nil, err
	}
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(real))
	if err != nil {
		return nil, err
	}
	if len(infos) == 0 {
		return nil, nil
	}
	top := infos[len(infos)-1] // mounts are listed in the order they were made
	f, err := openNoFollow(real)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, &os.PathError{Op: "fstat", Path: real, Err: err}
	}
	opts := strings.Split(top.Options, ",")
	mp := &MountPoint{
		Root: top.Root, FSType: top.FSType, Source: top.Source, Options: opts,
		Dev: st.Dev, Ino: st.Ino,
	}
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		mp.Rdev = st.Rdev
	}
	mp.ReadOnly = mp.HasOption("ro")
	return mp, nil
}

// ResolveParent resolves symlinks in the directories leading to path but not
// in its last component, as the kernel does for umount2(UMOUNT_NOFOLLOW), so
// the path can be matched against /proc/self/mountinfo.
func ResolveParent(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, filepath.Base(abs)), nil
}

// Identity returns the device and inode of path without following a symlink
// at its last component, plus the device number if it is a device node.
func Identity(path string) (dev, ino, rdev uint64, err error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0, 0, 0, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		rdev = st.Rdev
	}
	return st.Dev, st.Ino, rdev, nil
}

// FileID returns the device and inode of path, following symlinks: what
// the path names, wherever a link points.
func FileID(path string) (dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return st.Dev, st.Ino, nil
}

// MountsOn lists the mount points of the file system on device dev (the
// major and minor numbers of st_dev), from /proc/self/mountinfo alone:
// what a start finds of a file system it may have left frozen, whatever
// paths its records name.
func MountsOn(dev uint64) ([]string, error) {
	major, minor := int(unix.Major(dev)), int(unix.Minor(dev))
	infos, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) {
		return i.Major != major || i.Minor != minor, false
	})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(infos))
	for _, i := range infos {
		out = append(out, i.Mountpoint)
	}
	return out, nil
}
