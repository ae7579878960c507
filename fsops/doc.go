// Package fsops holds the file-system operations the driver is made of:
// atomic file writes, bind mounts and their inspection, file-system and tree
// usage, preallocated backing files, project quotas, and the tree copy used
// for clones.
//
// It knows nothing of CSI or volumes and never logs. Errors carry the
// operation and path and unwrap to the errno, so callers decide with
// errors.Is(err, unix.ENOSPC) and never by message text.
//
// Everything here is Linux-only; other systems get ErrNotSupported.
package fsops

import "errors"

// ErrNotSupported is returned where the kernel or file system lacks a
// feature this package needs (for example project quotas).
var ErrNotSupported = errors.New("not supported on this system or file system")
