package engine

import (
	"context"
	"io"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
	"github.com/hostpath-csi/hostpath/transfer"
)

// volumeLayout is how a volume keeps its data in its pool and shows it on
// the node. There is one for each kind of volume, each in a file of its
// own: a directory (layout_directory.go), an image file holding a file
// system of its own (layout_image.go), a block device's backing file
// (layout_block.go). The record chooses (layoutFor), once per operation;
// what is common to every volume (records, locks, pins, publications,
// the create protocol) stays with the callers.
type volumeLayout interface {
	// createData makes v's data, empty or from its source on this node
	// (the caller pinned the source and holds a heavy slot for a copy).
	// A failure leaves what removeData undoes.
	createData(ctx context.Context, v VolumeRecord) error
	// syncData makes new data durable before v's record says ready.
	syncData(v VolumeRecord) error
	// removeData removes what v has on disk; what is gone is no error.
	removeData(v VolumeRecord) error
	// grow gives v's data its new size on disk.
	grow(ctx context.Context, v VolumeRecord, size int64) error
	// stage shows v at a staging path its record already names.
	stage(v VolumeRecord, staging string) error
	// mountSource is what a publication bind-mounts: a path, and a
	// read-only device made for it that a failed mount lets go of.
	mountSource(v VolumeRecord, readOnly bool) (string, *loop.Device, error)
	// unmounted lets go of what a mount of v held once it is unmounted.
	unmounted(mp *fsops.MountPoint, v VolumeRecord) error
	// shows reports whether the mount mp shows v.
	shows(mp *fsops.MountPoint, v VolumeRecord) (bool, error)
	// stats measures v, mounted at path.
	stats(v VolumeRecord, path string) (volumeStats, error)
	// resizeOnNode makes the node's view of v (its device, its file
	// system mounted at path) the size v's data has.
	resizeOnNode(v VolumeRecord, path string) error
	// expectedBytes is what copying v will move, where it is known
	// without walking a tree; 0 means not known.
	expectedBytes(v VolumeRecord) int64
	// cutSnapshot makes what snapshot s of v (in s.Format) needs of v
	// while v's file system is frozen (the copy, and nothing else), and
	// returns the rest, for after the thaw, which returns the bytes the
	// snapshot holds and, for an archive, its sha256.
	cutSnapshot(ctx context.Context, v VolumeRecord, s SnapshotRecord, compact bool) (snapshotRest, error)
	// serve is what the transfer sends of v to another node: the wire
	// format and how to open the stream.
	serve(v VolumeRecord) (format string, open func(context.Context) (io.ReadCloser, error))
	// build writes a stream received from another node into v's data.
	build(ctx context.Context, v VolumeRecord, m transfer.Meta, body io.Reader) error
}

// layoutFor is the layout of volume v, as its record says.
func (d *Engine) layoutFor(v VolumeRecord) volumeLayout {
	switch {
	case v.AccessType == AccessBlock:
		return blockLayout{d}
	case isImage(v):
		return imageLayout{d}
	}
	return directoryLayout{d}
}
