package engine

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/hostpath-csi/hostpath/archive"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
	"github.com/hostpath-csi/hostpath/transfer"
)

// blockLayout is a block volume: a preallocated backing file in its pool
// (volumes/<id>.img) bound to a loop device, whose device node is what a
// publication shows (block.go has its files and devices).
type blockLayout struct{ *Engine }

func (d blockLayout) createData(ctx context.Context, v VolumeRecord) error {
	return d.createBlockData(ctx, v)
}

// syncData: the file is made durable as it is written
// (fsops.CreateDurable), or at the first stage or publish when it is
// fresh (settleBlock), or repaired at start.
func (blockLayout) syncData(VolumeRecord) error { return nil }

func (d blockLayout) removeData(v VolumeRecord) error { return d.removeBlockData(v) }

// grow: allocated, as the file was made.
func (d blockLayout) grow(_ context.Context, v VolumeRecord, size int64) error {
	return growBacking(d.VolumeDataPath(v), size, fsops.GrowFile, func() (loop.Device, error) { return d.attachBlock(v) })
}

// stage: the device is attached; it needs no staging mount.
func (d blockLayout) stage(v VolumeRecord, _ string) error {
	if _, err := d.attachBlock(v); err != nil {
		return fmt.Errorf("attaching block volume %s: %w", v.ID, err)
	}
	return nil
}

// mountSource: the device node, or a read-only device of its own for a
// read-only publication.
func (d blockLayout) mountSource(v VolumeRecord, readOnly bool) (string, *loop.Device, error) {
	if readOnly {
		dev, err := d.readOnlyBlockDevice(v)
		return dev.Path(), &dev, err
	}
	dev, err := d.attachBlock(v)
	return dev.Path(), nil, err
}

// unmounted lets a read-only publication's own device go.
func (d blockLayout) unmounted(mp *fsops.MountPoint, v VolumeRecord) error {
	if err := d.releaseBlockDevice(mp.Rdev, v); err != nil {
		return fmt.Errorf("detaching the read-only device of volume %s: %w", v.ID, err)
	}
	return nil
}

// shows: the mount is one of the volume's device nodes.
func (d blockLayout) shows(mp *fsops.MountPoint, v VolumeRecord) (bool, error) {
	return d.onDevice(mp.Rdev, v)
}

// stats: the device's size; a block volume has no file system to read.
func (d blockLayout) stats(v VolumeRecord, _ string) (volumeStats, error) {
	dev, err := d.attachBlock(v)
	if err != nil {
		return volumeStats{}, fmt.Errorf("finding the device of volume %s: %w", v.ID, err)
	}
	size, err := loop.Size(dev.Path())
	if err != nil {
		return volumeStats{}, fmt.Errorf("reading the size of %s: %w", dev.Path(), err)
	}
	return volumeStats{Block: true, Total: size}, nil
}

// resizeOnNode: the loop device re-reads its file's size.
func (d blockLayout) resizeOnNode(v VolumeRecord, _ string) error {
	dev, err := d.attachBlock(v)
	if err == nil {
		err = loop.Resize(dev)
	}
	if err != nil {
		return fmt.Errorf("resizing the device of volume %s: %w", v.ID, err)
	}
	return nil
}

func (d blockLayout) expectedBytes(v VolumeRecord) int64 { return allocatedBytes(d.VolumeDataPath(v)) }

// cutSnapshot: a copy of the file (FormatImage), its devices flushed;
// nothing is frozen, but a group's copies are made together.
func (d blockLayout) cutSnapshot(ctx context.Context, v VolumeRecord, s SnapshotRecord, _ bool) (snapshotRest, error) {
	size, sum, err := d.writeBlockSnapshot(ctx, v, s)
	return restDone(size, sum), err
}

// serve: the file's extents, after its devices' caches are flushed.
func (d blockLayout) serve(v VolumeRecord) (string, func(context.Context) (io.ReadCloser, error)) {
	path := d.VolumeDataPath(v)
	return wireExtents, func(ctx context.Context) (io.ReadCloser, error) {
		if err := flushAll(path); err != nil {
			return nil, err
		}
		return extentsOf(ctx, path)
	}
}

// build: the extents received, the file allocated to the volume's size.
func (d blockLayout) build(ctx context.Context, v VolumeRecord, m transfer.Meta, body io.Reader) error {
	if m.Format != wireExtents {
		return fmt.Errorf("%w: a block source came as %q", archive.ErrFormat, m.Format)
	}
	err := d.buildExtents(ctx, v, body, func(out *os.File) error { return fsops.AllocateFile(int(out.Fd()), v.CapacityBytes) })
	if err != nil {
		return err
	}
	_, err = d.attachBlock(v)
	return err
}

// growBacking grows a volume's file with grow and tells its loop device,
// so the new size shows in BLKGETSIZE64 at once, also while the volume is
// published.
func growBacking(path string, size int64, grow func(string, int64) error, attach func() (loop.Device, error)) error {
	if err := grow(path, size); err != nil {
		return err
	}
	dev, err := attach()
	if err != nil {
		return err
	}
	return loop.Resize(dev)
}

// onDevice reports whether rdev is one of the devices bound to v's file.
func (d *Engine) onDevice(rdev uint64, v VolumeRecord) (bool, error) {
	if rdev == 0 {
		return false, nil
	}
	devs, err := d.BlockDevices(v)
	if err != nil {
		return false, err
	}
	for _, dev := range devs {
		if dev.Rdev == rdev {
			return true, nil
		}
	}
	return false, nil
}

// allocatedBytes is the bytes a file occupies, 0 when it cannot be read.
func allocatedBytes(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	_, allocated, err := fsops.FileSize(f)
	if err != nil {
		return 0
	}
	return allocated
}
