package fsops

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Kernel is what the running kernel offers the driver, probed once at
// start so that a kernel too old says so in one line instead of failing
// later, request by request.
type Kernel struct {
	Release string
	// Openat2 (Linux 5.6) confines every path the driver resolves inside
	// volumes and archives; the driver cannot run safely without it.
	Openat2 bool
	// QuotactlFD (Linux 5.14) sets project quotas through a descriptor;
	// without it they go through the device node (see quotactlFD).
	QuotactlFD bool
}

// ErrKernelTooOld is what CheckKernel's error unwraps to.
var ErrKernelTooOld = errors.New("kernel too old")

// ProbeKernel asks the kernel, with harmless calls on dir, which of the
// features above it has: a missing system call answers ENOSYS.
func ProbeKernel(dir string) (Kernel, error) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return Kernel{}, err
	}
	k := Kernel{Release: unix.ByteSliceToString(uts.Release[:])}
	fd, err := openDir(dir)
	if err != nil {
		return k, err
	}
	defer unix.Close(fd)
	sub, err := OpenBeneath(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY)
	switch {
	case err == nil:
		unix.Close(sub)
		k.Openat2 = true
	case !errors.Is(err, unix.ENOSYS):
		return k, err
	}
	// An invalid command: EINVAL (or EPERM) from a kernel that has the
	// call, ENOSYS from one that does not.
	_, _, errno := unix.Syscall6(sysQuotactlFD, uintptr(fd), 0, 0, 0, 0, 0)
	k.QuotactlFD = errno != unix.ENOSYS
	return k, nil
}

// CheckKernel returns an error naming what is missing when the kernel
// lacks a feature the driver cannot do without.
func (k Kernel) CheckKernel() error {
	if !k.Openat2 {
		return fmt.Errorf("%w: Linux %s has no openat2(2), which the driver needs (Linux 5.6 or later) to keep every path it opens inside a volume or an archive's target", ErrKernelTooOld, k.Release)
	}
	return nil
}
