package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
)

// createBlockData makes a block volume: a preallocated backing file (or a
// copy of its source's) bound to a loop device. A failure at any step
// leaves neither file nor device; removeBlockData is the undo.
func (d *Engine) createBlockData(ctx context.Context, v VolumeRecord) error {
	path := d.VolumeDataPath(v)
	src, err := d.sourceFile(v)
	if err != nil {
		return err
	}
	if src == "" && v.Fresh {
		return createFreshBlock(path, v.CapacityBytes)
	}
	if src == "" {
		if err := fsops.CreateBackingFile(path, v.CapacityBytes); err != nil {
			return err
		}
	} else if err := d.copyBacking(ctx, src, path, v.CapacityBytes, true); err != nil {
		return err
	}
	_, err = attachBacking(path, blockLoop)
	return err
}

// blockLoop binds a block volume's loop device with direct I/O: a pod's
// writes reach the volume's file with O_DIRECT, past the pool's page
// cache, where they would be cached a second time (the pod's own page
// cache is above the device), and a flush of the device is a flush of the
// file. Its logical blocks stay 512 bytes, what a pod's file system on
// the device was made for. Where the file cannot take direct I/O at that
// size (btrfs, or an XFS file that shares blocks: a restore or clone, whose
// direct I/O must be aligned to XFS's block) the kernel binds it
// buffered, as before.
var blockLoop = loop.Options{DirectIO: true}

// sourceFile is the file a file-backed volume is restored or cloned from
// (its source snapshot's image, its source volume's file), or "" for an
// empty volume.
func (d *Engine) sourceFile(v VolumeRecord) (string, error) {
	switch {
	case v.SourceSnapshot != "":
		s, ok := d.Records.Snapshots.Get(v.SourceSnapshot)
		if !ok {
			return "", os.ErrNotExist
		}
		// An image snapshot's data is checked against its sum before a
		// restore copies it (a reflink or an extent copy reads nothing
		// that could be checked on the way).
		if err := d.checkDataSum(s); err != nil {
			return "", err
		}
		return d.SnapshotDataPath(s), nil
	case v.SourceVolume != "":
		s, ok := d.Records.Volumes.Get(v.SourceVolume)
		if !ok {
			return "", os.ErrNotExist
		}
		return d.VolumeDataPath(s), nil
	}
	return "", nil
}

// createFreshBlock makes an empty block volume's file at its full size,
// then reserves its blocks and binds its loop device side by side: the
// device takes the file's size when it is bound, and the blocks need only
// be reserved by the time CreateVolume returns. The caller's undo
// (removeBlockData) takes away what a failure leaves.
func createFreshBlock(path string, size int64) error {
	f, err := fsops.CreateSparseFile(path, size)
	if err != nil {
		return err
	}
	defer f.Close()
	allocated := make(chan error, 1)
	go func() { allocated <- fsops.AllocateFile(int(f.Fd()), size) }()
	_, err = attachBacking(path, blockLoop)
	if aerr := <-allocated; err == nil {
		err = aerr
	}
	return err
}

// copyBacking makes dst a copy of the file src (reflinked or sparse) and
// then gives it its full size, allocated if asked (a block volume; an
// image stays sparse): a restore keeps the new volume's size, never the
// snapshot's. dst appears only complete.
func (d *Engine) copyBacking(ctx context.Context, src, dst string, size int64, allocate bool) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	srcSize, _, err := fsops.FileSize(in)
	if err != nil {
		return err
	}
	tmp := filepath.Join(tmpBeside(dst), filepath.Base(dst)+".partial")
	return fsops.CreateDurable(dst, tmp, 0o600, func(out *os.File) error {
		if _, err := fsops.CopyFileData(ctx, int(out.Fd()), int(in.Fd()), min(srcSize, size), nil); err != nil {
			return err
		}
		if !allocate {
			return out.Truncate(size)
		}
		return fsops.AllocateFile(int(out.Fd()), size)
	})
}

// removeBlockData detaches the volume's loop device and removes its file.
func (d *Engine) removeBlockData(v VolumeRecord) error {
	path := d.VolumeDataPath(v)
	if _, err := os.Lstat(path); os.IsNotExist(err) {
		return nil
	}
	if err := DetachAll(path); err != nil {
		return err
	}
	return fsops.RemoveDurable(path)
}

// DetachAll lets go of every loop device bound to the file at path.
func DetachAll(path string) error {
	devs, err := loop.FindAll(path)
	if err != nil {
		return err
	}
	for _, dev := range devs {
		if err := loop.Detach(dev); err != nil {
			return err
		}
	}
	return nil
}

// flushAll writes back what the loop devices bound to path hold in their
// own page cache, so the file shows every write they took: before a copy
// of it, and before it is judged empty.
func flushAll(path string) error {
	devs, err := loop.FindAll(path)
	if err != nil {
		return err
	}
	for _, dev := range devs {
		f, err := os.Open(dev.Path())
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// settleBlock makes a fresh block volume's backing file durable (its
// blocks and its name) before a pod can write to it, and records that.
func (d *Engine) settleBlock(v *VolumeRecord) error {
	if v.AccessType != AccessBlock || !v.Fresh {
		return nil
	}
	if err := fsops.SyncFile(d.VolumeDataPath(*v)); err != nil {
		return err
	}
	return d.markSettled(v)
}

// markSettled makes the name of a fresh volume's fsynced backing file
// durable and records that the volume is no longer fresh.
func (d *Engine) markSettled(v *VolumeRecord) error {
	if err := fsops.SyncDir(filepath.Dir(d.VolumeDataPath(*v))); err != nil {
		return err
	}
	v.Fresh = false
	return d.Records.Volumes.Put(*v)
}

// repairFresh makes a fresh block volume's backing file whole and durable
// at start: a power loss may have taken it, or its size, before anything
// was written to it, so making it again loses nothing.
func (d *Engine) repairFresh(v VolumeRecord) error {
	path := d.VolumeDataPath(v)
	st, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		klog.InfoS("repair: making again the backing file of an empty block volume that a power loss took", "volume_id", v.ID, "name", v.Name, "path", path)
		err = fsops.CreateBackingFile(path, v.CapacityBytes)
	case err != nil:
		return err
	default:
		if st.Size() < v.CapacityBytes {
			klog.InfoS("repair: giving an empty block volume's backing file its size back after a power loss", "volume_id", v.ID, "name", v.Name, "path", path, "size", st.Size())
		}
		// Never smaller: an expansion grows the file before its record,
		// so a crash between them leaves the file the larger.
		err = fsops.GrowFile(path, max(st.Size(), v.CapacityBytes))
	}
	if err != nil {
		return err
	}
	return d.markSettled(&v)
}

// attachBlock returns the volume's loop device, binding one if the file
// has none (after a reboot, or if someone detached it).
func (d *Engine) attachBlock(v VolumeRecord) (loop.Device, error) {
	d.bindMu.Lock() // as attachImage
	defer d.bindMu.Unlock()
	path := d.VolumeDataPath(v)
	dev, ok, err := loop.Find(path)
	if err != nil {
		return dev, err
	}
	if ok {
		return dev, bufferedOnBtrfs(dev, path)
	}
	return attachBacking(path, blockLoop)
}

// BlockDevices lists the loop devices bound to a volume's file: its
// writable device and one read-only device per read-only publication.
func (d *Engine) BlockDevices(v VolumeRecord) ([]loop.Device, error) {
	return loop.FindAll(d.VolumeDataPath(v))
}

// readOnlyBlockDevice binds a read-only loop device for a read-only
// publication. A read-only bind mount of a device node would not stop
// writes to the device, so read-only must come from the device itself.
func (d *Engine) readOnlyBlockDevice(v VolumeRecord) (loop.Device, error) {
	opts := blockLoop
	opts.ReadOnly = true
	return loop.Attach(d.VolumeDataPath(v), opts)
}

// releaseBlockDevice detaches a read-only device that no mount uses any
// more; the writable device stays until the volume is deleted.
func (d *Engine) releaseBlockDevice(rdev uint64, v VolumeRecord) error {
	devs, err := d.BlockDevices(v)
	if err != nil {
		return err
	}
	for _, dev := range devs {
		if dev.Rdev == rdev && dev.ReadOnly {
			return loop.Detach(dev)
		}
	}
	return nil
}

// reattachBlockVolumes gives every block volume of the pools that are up
// its loop device back after a restart or reboot (before Probe reports
// ready), or when a pool comes up. Those already bound are left bound, but
// on btrfs their direct I/O is turned off (bufferedOnBtrfs): an earlier
// release bound them with it, and a running pod's rewrites must not wait
// for a Node call to stop reading back as EIO.
func (d *Engine) reattachBlockVolumes() error {
	bound, err := loop.List()
	if err != nil {
		return err
	}
	attached := map[[2]uint64][]loop.Device{}
	for _, b := range bound {
		if !b.ReadOnly {
			k := [2]uint64{b.BackingDev, b.BackingIno}
			attached[k] = append(attached[k], b.Device)
		}
	}
	for _, v := range d.Records.Volumes.All() {
		if !fileBacked(v) || v.Phase != PhaseReady {
			continue
		}
		if d.PoolOf(v.Pool).Get().Down != nil {
			continue
		}
		path := d.VolumeDataPath(v)
		fdev, ino, _, err := fsops.Identity(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // reported by reconcile and health; attached on publish once back
		} else if err != nil {
			return err
		}
		if devs := attached[[2]uint64{fdev, ino}]; len(devs) > 0 {
			for _, dev := range devs {
				if !dev.DirectIO {
					continue
				}
				if err := bufferedOnBtrfs(dev, path); err != nil {
					return fmt.Errorf("turning off direct I/O on %s, bound to %s on btrfs: %w", dev.Path(), path, err)
				}
			}
			continue
		}
		dev, err := d.attachFile(v)
		if err != nil {
			return err
		}
		klog.InfoS("repair: re-attached block volume", "volume_id", v.ID, "device", dev.Path())
	}
	return nil
}

// writeBlockSnapshot copies the backing file's allocated extents (or
// reflinks it) into the snapshot: a 10 GiB volume holding 200 MiB costs
// about 200 MiB, or only metadata where blocks can be shared. It returns
// the bytes the snapshot occupies.
func (d *Engine) writeBlockSnapshot(ctx context.Context, v VolumeRecord, s SnapshotRecord) (int64, string, error) {
	// The device's page cache may hold writes the file has not seen.
	if err := flushAll(d.VolumeDataPath(v)); err != nil {
		return 0, "", err
	}
	return d.writeFileSnapshot(ctx, d.VolumeDataPath(v), s)
}

// writeFileSnapshot copies the file at path (an image or a copy of one)
// into snapshot s, durable before it is renamed into place, and returns
// the bytes the snapshot occupies.
func (d *Engine) writeFileSnapshot(ctx context.Context, path string, s SnapshotRecord) (int64, string, error) {
	src, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer src.Close()
	size, _, err := fsops.FileSize(src)
	if err != nil {
		return 0, "", err
	}
	var allocated int64
	err = fsops.CreateDurable(d.SnapshotDataPath(s), d.snapshotTempPath(s), 0o600, func(out *os.File) error {
		if _, err := fsops.CopyFileData(ctx, int(out.Fd()), int(src.Fd()), size, nil); err != nil {
			return err
		}
		if err := out.Sync(); err != nil { // st_blocks is final once the data is on disk
			return err
		}
		_, allocated, err = fsops.FileSize(out)
		return err
	})
	return allocated, "", err
}
