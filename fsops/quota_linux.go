package fsops

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Project quotas by syscall: the inode's project id and inherit flag with
// FS_IOC_FSSETXATTR, the limit with quotactl_fd(2) (Linux 5.14), which
// takes a descriptor of any file on the file system instead of a device
// path, so it works in a container that has no node for the disk (older
// kernels: quotactl(2) on the device node, see quotactlFD). XFS and
// ext4 (with the project feature, mounted with prjquota) both answer the
// generic Q_SETQUOTA/Q_GETQUOTA commands. x/sys/unix has neither the
// structs nor the ioctl numbers, so they are declared here from
// <linux/fs.h> and <linux/quota.h>.

// fsxattr is struct fsxattr.
type fsxattr struct {
	Xflags     uint32
	Extsize    uint32
	Nextents   uint32
	Projid     uint32
	Cowextsize uint32
	_          [8]byte
}

// ifDqblk is struct if_dqblk.
type ifDqblk struct {
	BHardlimit uint64 // in 1 KiB quota blocks
	BSoftlimit uint64
	CurSpace   uint64 // bytes
	IHardlimit uint64
	ISoftlimit uint64
	CurInodes  uint64
	BTime      uint64
	ITime      uint64
	Valid      uint32
	_          uint32
}

// ifDqinfo is struct if_dqinfo.
type ifDqinfo struct {
	BGrace, IGrace uint64
	Flags, Valid   uint32
}

const (
	fsIocFsgetxattr    = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFssetxattr    = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjinherit = 0x00000200
	prjQuota           = 2
	qGetInfo           = 0x800005
	qGetQuota          = 0x800007
	qSetQuota          = 0x800008
	qifBLimits         = 1
	quotaBlockSize     = 1024
	sysQuotactlFD      = 443 // same number on every architecture
	quotaCmdShift      = 8
	quotaCmdTypeMask   = 0xff
)

func qcmd(cmd, typ int) int { return cmd<<quotaCmdShift | typ&quotaCmdTypeMask }

// quotactlFD runs a quota command on the file system holding fd. Kernels
// before 5.14 (Debian 11's 5.10 among them) have no quotactl_fd; there it
// falls back to quotactl(2) on the device the file system is mounted
// from, found by the descriptor's st_dev in /proc/self/mountinfo. That
// needs the device node (a driver pod has the host's /dev); without it
// the error says which node was missing. Both the missing call and the
// node found are remembered: volume stats ask on every kubelet pass.
func quotactlFD(fd int, cmd int, id uint32, addr unsafe.Pointer) error {
	if !noQuotactlFD.Load() {
		_, _, errno := unix.Syscall6(sysQuotactlFD, uintptr(fd), uintptr(cmd), uintptr(id), uintptr(addr), 0, 0)
		if errno != unix.ENOSYS {
			if errno != 0 {
				return errno
			}
			return nil
		}
		noQuotactlFD.Store(true)
	}
	dev, err := mountDevice(fd)
	if err != nil {
		return err
	}
	p, err := unix.BytePtrFromString(dev)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall6(unix.SYS_QUOTACTL, uintptr(cmd), uintptr(unsafe.Pointer(p)), uintptr(id), uintptr(addr), 0, 0); errno != 0 {
		return &os.PathError{Op: "quotactl (no quotactl_fd before Linux 5.14)", Path: dev, Err: errno}
	}
	return nil
}

var (
	noQuotactlFD atomic.Bool // the kernel answered ENOSYS (before 5.14)
	quotaDevices sync.Map    // st_dev (uint64) -> device node path
)

// isDevice says whether path is the block device node dev.
func isDevice(path string, dev uint64) bool {
	var st unix.Stat_t
	return unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == dev
}

// mountDevice finds the device node of the file system holding fd: from
// the cache while the node is still that device, else from mountinfo.
func mountDevice(fd int) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", err
	}
	if p, ok := quotaDevices.Load(st.Dev); ok && isDevice(p.(string), st.Dev) {
		return p.(string), nil
	}
	major, minor := int(unix.Major(st.Dev)), int(unix.Minor(st.Dev))
	infos, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) {
		return i.Major != major || i.Minor != minor, false
	})
	if err != nil {
		return "", err
	}
	for _, i := range infos {
		if strings.HasPrefix(i.Source, "/dev/") && isDevice(i.Source, st.Dev) {
			quotaDevices.Store(st.Dev, i.Source)
			return i.Source, nil
		}
	}
	// ENOSYS: as far as the caller can tell, this kernel cannot do it.
	return "", &os.PathError{Op: fmt.Sprintf("quotactl_fd (Linux 5.14) missing and no device node for %d:%d to fall back on", major, minor), Path: "/dev", Err: unix.ENOSYS}
}

func openDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return fd, nil
}

// ProjectQuotaSupported reports whether the file system holding dir has
// project quotas switched on. The error, if any, says why not (ENOSYS: no
// quotactl_fd; ESRCH or ENOENT: quotas not enabled; EOPNOTSUPP: the file
// system has none).
func ProjectQuotaSupported(dir string) error {
	fd, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var info ifDqinfo
	if err := quotactlFD(fd, qcmd(qGetInfo, prjQuota), 0, unsafe.Pointer(&info)); err != nil {
		return &os.PathError{Op: "quotactl_fd(Q_GETINFO, PRJQUOTA)", Path: dir, Err: err}
	}
	return nil
}

// SetProject gives dir the project id and the inherit flag, so everything
// created below it is charged to that project.
func SetProject(dir string, id uint32) error {
	fd, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var fa fsxattr
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFsgetxattr, uintptr(unsafe.Pointer(&fa))); errno != 0 {
		return &os.PathError{Op: "ioctl(FS_IOC_FSGETXATTR)", Path: dir, Err: errno}
	}
	fa.Projid = id
	fa.Xflags |= fsXflagProjinherit
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFssetxattr, uintptr(unsafe.Pointer(&fa))); errno != 0 {
		return &os.PathError{Op: "ioctl(FS_IOC_FSSETXATTR)", Path: dir, Err: errno}
	}
	return nil
}

// SetProjectLimit sets the hard byte limit of a project (0 removes it),
// rounded up to the 1 KiB unit quotas count in. dir is any directory on
// the file system.
func SetProjectLimit(dir string, id uint32, bytes int64) error {
	fd, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	q := ifDqblk{BHardlimit: uint64((bytes + quotaBlockSize - 1) / quotaBlockSize), Valid: qifBLimits}
	if err := quotactlFD(fd, qcmd(qSetQuota, prjQuota), id, unsafe.Pointer(&q)); err != nil {
		return &os.PathError{Op: "quotactl_fd(Q_SETQUOTA, PRJQUOTA)", Path: dir, Err: err}
	}
	return nil
}

// ProjectUsage is what the kernel charges to a project.
type ProjectUsage struct {
	UsedBytes, LimitBytes int64
	Inodes                int64
}

// GetProjectUsage reads a project's usage and limit.
func GetProjectUsage(dir string, id uint32) (ProjectUsage, error) {
	fd, err := openDir(dir)
	if err != nil {
		return ProjectUsage{}, err
	}
	defer unix.Close(fd)
	var q ifDqblk
	if err := quotactlFD(fd, qcmd(qGetQuota, prjQuota), id, unsafe.Pointer(&q)); err != nil {
		return ProjectUsage{}, &os.PathError{Op: "quotactl_fd(Q_GETQUOTA, PRJQUOTA)", Path: dir, Err: err}
	}
	return ProjectUsage{UsedBytes: int64(q.CurSpace), LimitBytes: int64(q.BHardlimit) * quotaBlockSize, Inodes: int64(q.CurInodes)}, nil
}
