package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/format/ext4"
	"github.com/hostpath-csi/hostpath/format/xfs"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
)

// The image layout: a mount volume whose StorageClass says layout=image
// is a sparse image file in its pool (volumes/<id>.img, as a block
// volume's file), bound to a loop device with direct I/O, holding an ext4
// (or, where the class asks, an XFS) of its own made in-process
// (format/ext4, format/xfs). NodeStage mounts that file
// system at the staging path; each publication is a bind mount of it. A
// file system of its own is what lets a snapshot be one instant: it is
// frozen (FIFREEZE), its image copied (a reflink where the pool can share
// blocks), and thawed.

// ParamLayout chooses a mount volume's layout (StorageClass).
const ParamLayout = "layout"

// Layouts of a mount volume.
const (
	LayoutDirectory = "directory" // a directory in the pool: the default
	LayoutImage     = "image"     // an image file with an ext4 or XFS of its own
)

// The file systems an image volume may hold (csi.storage.k8s.io/fstype).
const (
	FSExt4 = "ext4"
	FSXFS  = "xfs"
)

// ImageFSType is the file system an image volume holds when its class
// names none.
const ImageFSType = FSExt4

// ImageFSTypes are the file systems image volumes can hold.
var ImageFSTypes = []string{FSExt4, FSXFS}

// makesFS is the file system image volume v is made to hold when empty.
func makesFS(v VolumeRecord) string {
	if v.FSType == "" {
		return FSExt4
	}
	return v.FSType
}

// imageLimits are the sizes an image volume of file system fs may have.
//
//nolint:unparam // ext4 and XFS have the same largest size today, not by design
func imageLimits(fs string) (minSize, maxSize int64) {
	if fs == FSXFS {
		return xfs.MinSize, xfs.MaxSize
	}
	return ext4.MinSize, ext4.MaxSize
}

// probeFS says which file system the image or device at path holds, from
// its superblock: what it is mounted as, whatever the record says (a
// restore or a clone holds its source's).
func probeFS(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := xfs.ReadSize(f); err == nil {
		return FSXFS, nil
	} else if !errors.Is(err, xfs.ErrNotXFS) {
		return "", err
	}
	if _, err := ext4.ReadSize(f); err != nil {
		if errors.Is(err, ext4.ErrNotExt4) {
			return "", fmt.Errorf("%s holds neither ext4 nor XFS", path)
		}
		return "", err
	}
	return FSExt4, nil
}

// ImageFS is the file system image volume v holds, as its image says.
func (d *Engine) ImageFS(v VolumeRecord) (string, error) {
	fs, err := probeFS(d.VolumeDataPath(v))
	if err != nil {
		return "", fmt.Errorf("reading the file system of volume %s: %w", v.ID, err)
	}
	return fs, nil
}

// mountImage mounts the file system on an image volume's device at
// target and says which it is. XFS is mounted nouuid: a clone or restore
// keeps its source's UUID, and XFS refuses a second mount of one UUID
// otherwise.
func mountImage(dev loop.Device, target string, flags uintptr) (string, error) {
	fs, err := probeFS(dev.Path())
	if err != nil {
		return "", err
	}
	data := ""
	if fs == FSXFS {
		data = "nouuid"
	}
	return fs, fsops.MountDevice(dev.Path(), target, fs, flags, data)
}

// imageBlockSize is an image volume's device's logical block size: the
// file system's own (format/ext4 makes 4 KiB blocks), and no smaller
// than what direct I/O to a reflinked image needs (XFS asks its block
// size of a file that shares blocks, so at 512 a restored or cloned
// image would be refused direct I/O).
const imageBlockSize = 4096

// deviceBlockSize is the logical block size of the device of the image at
// path: imageBlockSize, or the file system's own smallest I/O where that
// is smaller, which a device of larger blocks cannot mount: a block
// volume's snapshot restored as an image volume may hold a pod's
// mkfs.ext4 -b 1024, or an XFS of 512-byte sectors. (Direct I/O to such a
// device may be refused where the image shares blocks on XFS; it is then
// buffered.)
func deviceBlockSize(path string) uint32 {
	f, err := os.Open(path)
	if err != nil {
		return imageBlockSize
	}
	defer f.Close()
	unit := uint32(imageBlockSize)
	if s, err := xfs.ReadSize(f); err == nil {
		unit = s.SectorSize
	} else if s, err := ext4.ReadSize(f); err == nil {
		unit = s.BlockSize
	}
	if unit < 512 || unit > imageBlockSize || unit&(unit-1) != 0 {
		return imageBlockSize
	}
	return unit
}

// isImage reports whether v is an image volume.
func isImage(v VolumeRecord) bool { return v.Layout == LayoutImage }

// layoutOf is a volume's layout: image or directory for a mount volume,
// "" for a block volume.
func layoutOf(v VolumeRecord) string { return orDirectory(v.AccessType, v.Layout) }

// snapshotLayout is the layout of the volume a snapshot was taken of: a
// mount volume's image is an image volume's.
func snapshotLayout(s SnapshotRecord) string {
	if s.AccessType == AccessMount && s.Format == FormatImage {
		return LayoutImage
	}
	return orDirectory(s.AccessType, "")
}

// orDirectory is a recorded layout, the empty one of a mount volume
// being a directory.
func orDirectory(access, layout string) string {
	if access == AccessMount && layout == "" {
		return LayoutDirectory
	}
	return layout
}

// fileBacked reports whether a volume's data is one file: a block
// volume's device or an image volume's file system.
func fileBacked(v VolumeRecord) bool { return v.AccessType == AccessBlock || isImage(v) }

// createImageData makes an image volume's file: a sparse file of the
// volume's size holding an empty ext4, or a copy of its source's image
// (a restore or a clone, grown to the volume's size; the file system
// follows at its first stage). The file appears only complete and
// durable; then its loop device is bound.
func (d *Engine) createImageData(ctx context.Context, v VolumeRecord) error {
	path := d.VolumeDataPath(v)
	src, err := d.sourceFile(v)
	if err != nil {
		return err
	}
	// A directory volume's snapshot is a tree to fill a new file system with.
	s, ok := d.Records.Snapshots.Get(v.SourceSnapshot)
	tree := ok && snapshotLayout(s) == LayoutDirectory
	switch {
	case src == "" || tree:
		err = d.makeEmptyImage(v)
		if err == nil && tree {
			err = d.fillImage(v, func(dir string) error { return d.restoreSnapshot(ctx, v.SourceSnapshot, dir) })
		}
	case v.SourceVolume != "":
		// A clone of a volume in use is one instant of it, as a snapshot.
		err = d.frozen(ctx, []VolumeRecord{d.sourceRecord(v)}, func(ctx context.Context) error {
			return d.copyBacking(ctx, src, path, v.CapacityBytes, false)
		})
	default:
		err = d.copyBacking(ctx, src, path, v.CapacityBytes, false)
	}
	if err != nil {
		return err
	}
	_, err = d.attachImage(v)
	return err
}

// sourceRecord is the record of v's source volume (the caller pinned it).
func (d *Engine) sourceRecord(v VolumeRecord) VolumeRecord {
	src, _ := d.Records.Volumes.Get(v.SourceVolume)
	return src
}

// attachImage returns the image volume's loop device, binding one with
// direct I/O if the file has none (after a reboot, or at create). Direct
// I/O keeps the volume's data out of the pool's page cache, where it
// would be cached twice; a pool whose file system refuses it (tmpfs)
// keeps the device buffered, which is only slower.
func (d *Engine) attachImage(v VolumeRecord) (loop.Device, error) {
	// Found and bound as one step: two callers (a stage and a snapshot's
	// flush, a pull's fill) must not both bind a writable device.
	d.bindMu.Lock()
	defer d.bindMu.Unlock()
	path := d.VolumeDataPath(v)
	dev, ok, err := loop.Find(path)
	if err != nil {
		return dev, err
	}
	if ok {
		return dev, bufferedOnBtrfs(dev, path)
	}
	if dev, err = attachBacking(path, loop.Options{BlockSize: deviceBlockSize(path), DirectIO: true}); err != nil {
		return dev, err
	}
	if !dev.DirectIO {
		klog.InfoS("image volume's loop device stays buffered: the pool's file system refuses direct I/O, or is btrfs", "volume_id", v.ID, "device", dev.Path())
	}
	return dev, nil
}

// attachBacking binds a volume's file to a writable loop device with
// opts. On XFS pools the file is opened so that the device's writes leave
// its times alone (fsops.OpenUntimed), sparing the pool a log commit of
// the inode at each flush of the device; elsewhere, or where XFS refuses,
// it is opened as usual.
//
// On btrfs the device stays buffered: btrfs checksums a direct write's
// pages while the file system above the device may still change them
// (they are not stable pages), and the block then fails its checksum at
// every later read (EIO). Kernels before 6.15 let that happen; 6.15 and
// later fall back to buffered writes themselves.
func attachBacking(path string, opts loop.Options) (loop.Device, error) {
	if opts.DirectIO && fsops.IsBtrfs(filepath.Dir(path)) {
		opts.DirectIO = false
	}
	f, err := fsops.OpenUntimed(path)
	if err != nil {
		if f, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return loop.Device{}, err
		}
	}
	defer f.Close()
	return loop.AttachFile(f, opts)
}

// bufferedOnBtrfs turns direct I/O off on a device bound with it to a
// file on btrfs (by an earlier release, which did): attachBacking says why.
func bufferedOnBtrfs(dev loop.Device, path string) error {
	if !fsops.IsBtrfs(filepath.Dir(path)) {
		return nil
	}
	info, err := loop.Status(dev)
	if err != nil || info.Flags&unix.LO_FLAGS_DIRECT_IO == 0 {
		return err
	}
	return loop.SetDirectIO(dev, false)
}

// attachFile returns the loop device of a file-backed volume.
func (d *Engine) attachFile(v VolumeRecord) (loop.Device, error) {
	if isImage(v) {
		return d.attachImage(v)
	}
	return d.attachBlock(v)
}

// stageImage mounts the image volume's file system at staging, unless it
// is already there, and grows it to its device if it is smaller (a
// restore into a larger volume, an expansion while it was not mounted).
// A failure leaves staging unmounted.
func (d *Engine) stageImage(v VolumeRecord, staging string) error {
	mp, ours, err := d.inspectMount(staging, v)
	if err != nil {
		return err
	}
	if mp != nil {
		if !ours {
			return StorageErr(ErrInUse, "%s already has another mount (%s on %s); it cannot also show volume %s", staging, mp.Source, mp.Root, v.ID)
		}
		return nil
	}
	if err := fsops.MakeMountPoint(staging, true); err != nil {
		return fmt.Errorf("creating %s: %w", staging, err)
	}
	dev, err := d.attachImage(v)
	if err != nil {
		return fmt.Errorf("attaching the image of volume %s: %w", v.ID, err)
	}
	if from, to, err := growUnmounted(dev); err != nil {
		klog.V(2).InfoS("an image volume's file system not grown before its mount; the growth after it will try", "volume_id", v.ID, "device", dev.Path(), "err", err)
	} else if to > from {
		klog.InfoS("grew an image volume's file system before its mount", "volume_id", v.ID, "device", dev.Path(), "from_blocks", from, "to_blocks", to)
	}
	// nosuid, nodev: what a pod (or a restore from another node) put in
	// the file system is data, never a device of this host or a program
	// that runs as someone else.
	fs, err := mountImage(dev, staging, unix.MS_NOSUID|unix.MS_NODEV)
	if err != nil {
		return fmt.Errorf("mounting the file system of volume %s (%s) at %s: %w", v.ID, dev.Path(), staging, err)
	}
	// A file system that cannot grow (no CAP_SYS_RESOURCE for ext4, an
	// I/O error) is staged at its own size: failing the stage would leave
	// a restore into a larger claim, or an expanded volume, unstageable
	// for good. Health says so, and stats give the file system's size.
	if err := d.growImage(v, dev, staging, fs); err != nil {
		klog.ErrorS(err, "an image volume's file system could not grow to its device; staged at its own size", "volume_id", v.ID, "path", staging)
		d.notify(v, "FileSystemNotGrown", fmt.Sprintf("staged on node %s at its file system's own size, smaller than the volume: %v", d.Config.NodeID, err))
	}
	return nil
}

// stagedImage is the staging path a publication of image volume v binds.
func (d *Engine) stagedImage(v VolumeRecord) (string, error) {
	for _, p := range v.Staged {
		ours, err := d.ShowsVolume(p, v)
		if err != nil {
			return "", err
		}
		if ours {
			return p, nil
		}
	}
	return "", StorageErr(ErrNotStaged, "volume %s is an image volume and is not staged on this node: NodeStageVolume mounts its file system, NodePublishVolume binds it", v.ID)
}

// imageStats is what statfs of the mounted file system says of an image
// volume: its own file system's size, use and inodes.
func imageStats(path string) (volumeStats, error) {
	fs, err := fsops.Statfs(path)
	if err != nil {
		return volumeStats{}, err
	}
	return volumeStats{
		Total: fs.TotalBytes, Used: fs.TotalBytes - fs.FreeBytes, Available: fs.AvailableBytes,
		InodesUsed: fs.TotalInodes - fs.FreeInodes, InodesFree: fs.FreeInodes,
	}, nil
}

// restorable says whether a snapshot of a volume of srcAccess and
// srcLayout can restore one of access and layout: the same kind; an image
// volume's snapshot as a block volume and a block volume's as an image
// volume (the volume mode change a block data mover asks for, with
// snapshot.storage.kubernetes.io/allow-volume-mode-change); or a
// directory volume's snapshot (a tree) as an image volume.
func restorable(snap, srcAccess, srcLayout, access, layout string) error {
	imageAndBlock := (srcLayout == LayoutImage && access == AccessBlock) || (srcAccess == AccessBlock && layout == LayoutImage)
	switch {
	case imageAndBlock, srcLayout == LayoutDirectory && layout == LayoutImage:
		return nil
	case srcAccess != access:
		return StorageErr(ErrInvalid, "source snapshot %s is of a %s volume; it cannot restore a %s volume (only image and block volumes restore as each other)", snap, srcAccess, access)
	case srcLayout != layout:
		return StorageErr(ErrInvalid, "source snapshot %s is of a %s-layout volume; it cannot restore a %s-layout volume (the StorageClass parameter %s)", snap, srcLayout, layout, ParamLayout)
	}
	return nil
}

// makeEmptyImage makes image volume v's file: a sparse file of its size
// holding an empty file system of the type it was asked to hold,
// complete and durable when it appears.
func (d *Engine) makeEmptyImage(v VolumeRecord) error {
	path := d.VolumeDataPath(v)
	tmp := filepath.Join(tmpBeside(path), filepath.Base(path)+".partial")
	return fsops.CreateDurable(path, tmp, 0o600, func(f *os.File) error {
		if err := f.Truncate(v.CapacityBytes); err != nil {
			return err
		}
		// Any pod's uid may write, as in a directory volume;
		// fsGroupPolicy File lets kubelet narrow that.
		var err error
		if makesFS(v) == FSXFS {
			_, err = xfs.Format(f, xfs.Options{RootMode: 0o777})
		} else {
			_, err = ext4.Format(f, ext4.Options{RootMode: 0o777})
		}
		return err
	})
}

// fillImage has fill write a tree (a directory volume's snapshot,
// restored here or received from another node) into image volume v's
// new empty file system, mounted for that on the pool's tmp/, and makes
// what it wrote durable in the image before the volume is recorded ready.
func (d *Engine) fillImage(v VolumeRecord, fill func(dir string) error) (err error) {
	dev, err := d.attachImage(v)
	if err != nil {
		return err
	}
	mnt := filepath.Join(d.PoolOf(v.Pool).Paths.Tmp(), v.ID+".fill")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	defer os.Remove(mnt)
	if _, err := mountImage(dev, mnt, unix.MS_NOSUID|unix.MS_NODEV); err != nil {
		return fmt.Errorf("mounting the new file system of volume %s: %w", v.ID, err)
	}
	mounted := true
	defer func() {
		if mounted {
			_ = fsops.Unmount(mnt) // on an earlier error, which is the one returned
		}
	}()
	if err := fill(mnt); err != nil {
		return err
	}
	// Written back to the device here, where a failure is seen (an
	// unmount writes back too, but says nothing of what failed); the
	// fsync of the image then makes it durable.
	if err := fsops.SyncFS(mnt); err != nil {
		return fmt.Errorf("writing the new file system of volume %s back to its image: %w", v.ID, err)
	}
	mounted = false
	if err := fsops.Unmount(mnt); err != nil {
		return err
	}
	return fsops.SyncFile(d.VolumeDataPath(v))
}

// releaseTemp lets go of what a driver that stopped mid-way may have left
// holding an entry of tmp/ (an image copy's loop device, the mount of a
// file system being filled or archived), so the entry can be removed and
// nothing is written to it any more.
func (d *Engine) releaseTemp(path string, e os.DirEntry) error {
	if e.IsDir() {
		mp, err := d.MountPoint(path)
		if err != nil {
			return err
		}
		if mp != nil {
			if err := fsops.Unmount(path); err != nil {
				return fmt.Errorf("unmounting what a stopped driver left mounted at %s: %w", path, err)
			}
		}
		return nil
	}
	if e.Type().IsRegular() && strings.HasSuffix(e.Name(), BlockSuffix) {
		return DetachAll(path)
	}
	return nil
}
