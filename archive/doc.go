// Package archive writes and reads the tar.gz streams that hold snapshots
// of directory volumes, in-process: a walk of the tree that is fd-relative
// and never follows a symlink, a tar stream with PAX headers (long names,
// nanosecond times, extended attributes, owners), compressed on every core
// into gzip members or zstd frames that each carry their length, so that a
// restore decompresses on every core too (see blockFormat). Any gzip or
// zstd reader reads them as one stream.
//
// Extraction confines every entry to the destination with openat2(2)
// (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), so an archive with absolute
// names, "..", or links that lead out cannot write outside it.
//
// It knows nothing of CSI, never logs, and returns errors that unwrap to
// the errno; a stream that is not a valid archive gives ErrFormat, one
// larger than allowed ErrTooLarge.
package archive

import "errors"

// ErrFormat marks a stream that is not a complete, valid tar.gz archive:
// corrupt, truncated, or with an entry this package refuses.
var ErrFormat = errors.New("invalid or truncated archive")

// ErrTooLarge marks a stream that declares more than the caller allows:
// nothing of it was written.
var ErrTooLarge = errors.New("the archive is larger than allowed")
