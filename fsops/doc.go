// Package fsops holds the file-system operations the driver is made of:
// atomic file writes, bind mounts and their inspection, file-system and tree
// usage, preallocated backing files, project quotas, and the tree copy used
// for clones.
//
// It knows nothing of CSI or volumes and never logs. Errors carry the
// operation and path and unwrap to the errno, so callers decide with
// errors.Is(err, unix.ENOSPC) and never by message text.
//
// It is Linux-only: it is made of Linux system calls and builds nowhere
// else. Where a file system lacks a feature (reflinks, project quotas),
// callers get the kernel's errno.
package fsops
