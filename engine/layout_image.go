package engine

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
	"github.com/hostpath-csi/hostpath/transfer"
)

// imageLayout is an image volume: a sparse image file in its pool
// (volumes/<id>.img) on a loop device with direct I/O, holding an ext4 or
// an XFS of its own, mounted at the staging path; publications bind that mount.
// Its snapshots, clones and sends are copies of the image cut frozen
// (image.go, image_snapshot.go).
type imageLayout struct{ *Engine }

func (d imageLayout) createData(ctx context.Context, v VolumeRecord) error {
	return d.createImageData(ctx, v)
}

// syncData: the image is made durable as it is written
// (fsops.CreateDurable).
func (imageLayout) syncData(VolumeRecord) error { return nil }

func (d imageLayout) removeData(v VolumeRecord) error { return d.removeBlockData(v) }

// grow: sparse, as the image was made; the file system follows online
// (resizeOnNode) or at the next stage.
func (d imageLayout) grow(_ context.Context, v VolumeRecord, size int64) error {
	return growBacking(d.VolumeDataPath(v), size, fsops.GrowSparse, func() (loop.Device, error) { return d.attachImage(v) })
}

// stage: under the volume's freeze lock, so a snapshot that found the
// volume unmounted copies it unmounted to the end.
func (d imageLayout) stage(v VolumeRecord, staging string) error {
	unlock, err := d.lockFreeze(v.ID)
	if err != nil {
		return err
	}
	defer unlock()
	return d.stageImage(v, staging)
}

// mountSource: the staged file system.
func (d imageLayout) mountSource(v VolumeRecord, _ bool) (string, *loop.Device, error) {
	staged, err := d.stagedImage(v)
	return staged, nil, err
}

func (imageLayout) unmounted(*fsops.MountPoint, VolumeRecord) error { return nil }

// shows: the mount is of the file system on one of the volume's devices.
func (d imageLayout) shows(mp *fsops.MountPoint, v VolumeRecord) (bool, error) {
	return d.onDevice(mp.Dev, v)
}

// stats: what statfs of its own file system says.
func (imageLayout) stats(v VolumeRecord, path string) (volumeStats, error) {
	st, err := imageStats(path)
	if err != nil {
		return volumeStats{}, fmt.Errorf("reading the file system of volume %s: %w", v.ID, err)
	}
	return st, nil
}

// resizeOnNode: the loop device re-reads its file's size, then the file
// system mounted at path grows into it, online, while pods write.
func (d imageLayout) resizeOnNode(v VolumeRecord, path string) error {
	// A frozen file system would hold the resize until its thaw.
	unlock, err := d.lockFreeze(v.ID)
	if err != nil {
		return err
	}
	defer unlock()
	dev, err := d.attachImage(v)
	if err == nil {
		err = loop.Resize(dev)
	}
	if err != nil {
		return fmt.Errorf("resizing the device of volume %s: %w", v.ID, err)
	}
	fs, err := d.ImageFS(v)
	if err != nil {
		return err
	}
	if err := d.growImage(v, dev, path, fs); err != nil {
		return fmt.Errorf("growing the file system of volume %s: %w", v.ID, err)
	}
	return nil
}

func (d imageLayout) expectedBytes(v VolumeRecord) int64 { return allocatedBytes(d.VolumeDataPath(v)) }

// cutSnapshot: while frozen, the image is copied (a reflink where the
// pool shares blocks): into the snapshot itself when it goes to the
// volume's pool, else into the pool's tmp/, and from there to the other
// pool after the thaw. An archive (an export of the tree) is made after
// the thaw too, from such a copy.
func (d imageLayout) cutSnapshot(ctx context.Context, v VolumeRecord, s SnapshotRecord, compact bool) (snapshotRest, error) {
	if s.Format == FormatImage && d.PoolOf(s.Pool) == d.PoolOf(v.Pool) {
		size, sum, err := d.writeBlockSnapshot(ctx, v, s)
		return restDone(size, sum), err
	}
	img, err := d.cutImage(ctx, v)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, abort bool) (size int64, sum string, err error) {
		defer os.Remove(img)
		switch {
		case abort:
			return 0, "", nil
		case s.Format == FormatImage:
			return d.writeFileSnapshot(ctx, img, s)
		}
		err = d.imageTree(v, img, func(tree string) error {
			size, sum, err = d.writeArchive(ctx, tree, s, compact)
			return err
		})
		return size, sum, err
	}, nil
}

// serve: read while its pods write, the image would be torn; what is sent
// is a copy cut frozen, as a snapshot is.
func (d imageLayout) serve(v VolumeRecord) (string, func(context.Context) (io.ReadCloser, error)) {
	return wireExtents, func(ctx context.Context) (io.ReadCloser, error) { return d.sendImage(ctx, v) }
}

// build: an image's extents, or a directory volume's snapshot as a tree,
// extracted into the new image's own file system.
func (d imageLayout) build(ctx context.Context, v VolumeRecord, m transfer.Meta, body io.Reader) error {
	if m.Format != wireExtents {
		if err := treeFormat(m); err != nil {
			return err
		}
		if err := d.makeEmptyImage(v); err != nil {
			return err
		}
		return d.fillImage(v, func(dir string) error { return d.extractTree(ctx, m, body, dir) })
	}
	// Sparse: the file system allocates.
	err := d.buildExtents(ctx, v, body, func(out *os.File) error { return out.Truncate(v.CapacityBytes) })
	if err != nil {
		return err
	}
	_, err = d.attachImage(v)
	return err
}
