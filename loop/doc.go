// Package loop attaches files to Linux loop devices and manages them with
// ioctls only: LOOP_CTL_GET_FREE and LOOP_CONFIGURE (one call, kernel 5.8+)
// with a LOOP_SET_FD + LOOP_SET_STATUS64 fallback, LOOP_CLR_FD,
// LOOP_SET_CAPACITY and BLKGETSIZE64. It never runs losetup.
//
// It knows nothing of CSI or volumes and never logs. Errors carry the
// ioctl and device and unwrap to the errno.
//
// github.com/freddierice/go-losetup/v2 is used for what it gets right (the
// device naming and the LOOP_GET_STATUS64 layout). It falls short for the
// rest, so that is done with golang.org/x/sys/unix: it has no
// LOOP_CONFIGURE, its free-device check compares an unsigned value with
// zero (never true, so errors pass as device numbers), its errors are
// flattened to strings (errors.Is(err, unix.EBUSY) cannot work), and two
// attaches racing for the same free device are not retried.
package loop
