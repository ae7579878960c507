package engine

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/format/ext4"
	"github.com/hostpath-csi/hostpath/format/xfs"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
)

// An image volume's file system grows to its device: online at
// NodeExpandVolume, or at the stage after a restore into a larger volume
// or an expansion while it was not mounted.

// growImage grows image volume v's file system fs, mounted at path, to
// its device (growImageFS), and keeps what health reports: the error of a
// growth that failed, until one succeeds. A device size at which the
// kernel's resize added nothing (it drops a last group too small to hold
// its own metadata) is remembered, so the growth is not tried again at
// every stage.
func (d *Engine) growImage(v VolumeRecord, dev loop.Device, path, fs string) error {
	devBytes, err := loop.Size(dev.Path())
	if err != nil {
		return err
	}
	if n, ok := d.grownAt.Load(v.ID); ok && n.(int64) == devBytes {
		return nil
	}
	before, _ := fsops.Statfs(path)
	if err := growImageFS(dev, devBytes, path, fs); err != nil {
		d.notGrown.Store(v.ID, fmt.Errorf("the file system is smaller than its %d-byte volume: %w", devBytes, err))
		return err
	}
	d.notGrown.Delete(v.ID)
	if after, err := fsops.Statfs(path); err == nil && after.TotalBytes == before.TotalBytes {
		d.grownAt.Store(v.ID, devBytes)
	}
	return nil
}

// NotGrownCount is how many image volumes' file systems could not grow
// to their volume.
func (d *Engine) NotGrownCount() int {
	n := 0
	d.notGrown.Range(func(any, any) bool { n++; return true })
	return n
}

// NotGrown says why image volume id's file system is smaller than its
// volume, if a growth to it failed.
func (d *Engine) NotGrown(id string) error {
	if err, ok := d.notGrown.Load(id); ok {
		return err.(error)
	}
	return nil
}

// growUnmounted grows the ext4 file system on an image volume's device,
// not mounted, to the device's size where format/ext4 can do it offline
// (its own layout, unmounted cleanly, within its descriptor blocks; see
// ext4.Grow): the kernel grows a mounted ext4 only for CAP_SYS_RESOURCE,
// and this needs nothing but the device. The device is opened O_EXCL,
// which the kernel refuses while anything has it mounted. What it does
// not grow (another file system or layout, a journal to replay, a growth
// past its descriptor blocks) is left to the growth after the mount
// (growImage), and so is one it could not finish: its writes leave the
// file system whole wherever they stop. It returns the file system's
// blocks before and after.
func growUnmounted(dev loop.Device) (from, to uint64, err error) {
	// A child forked while the device is open O_EXCL holds the open file
	// until its exec closes it, and the mount right after this returns
	// then finds the device claimed (EBUSY). The driver starts no
	// programs, but a process that embeds the engine may (its tests start
	// PostgreSQL beside a stage: TestStageBesideForks): the fork lock,
	// which every fork takes, keeps them out while the device is open.
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	f, err := os.OpenFile(dev.Path(), os.O_RDWR|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	before, err := ext4.ReadSize(f)
	if err != nil {
		return 0, 0, err
	}
	after, err := ext4.Grow(f)
	if err != nil {
		return before.Blocks, before.Blocks, err
	}
	return before.Blocks, after.Blocks, nil
}

// growImageFS grows the file system fs mounted at path to the size of its
// device (devBytes), online, if it is smaller. An ext4 grows to the blocks a file
// system made at that size spans (ext4.Blocks), so a tail too short for
// a group of its own (an odd-sized volume's last few blocks) is no reason
// to resize; an XFS to what the kernel's growfs makes of the device
// (xfs.GrowTarget), from the geometry the mounted file system reports
// (its superblock on the device may lag behind the kernel's).
func growImageFS(dev loop.Device, devBytes int64, path, fs string) error {
	if fs == FSXFS {
		blocks, agBlocks, err := fsops.XFSGeometry(path)
		if err != nil {
			return err
		}
		if want := xfs.GrowTarget(agBlocks, uint64(devBytes)/xfs.BlockSize); want > blocks {
			klog.V(2).InfoS("resizing an image volume's file system", "path", path, "fs", fs, "from_blocks", blocks, "to_blocks", want)
			return fsops.GrowXFS(path, want)
		}
		return nil
	}
	f, err := os.Open(dev.Path())
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := ext4.ReadSize(f)
	if err != nil {
		return err
	}
	want := uint64(devBytes) / uint64(size.BlockSize)
	if size.BlockSize == ext4.BlockSize && devBytes >= ext4.MinSize {
		// Made by format/ext4: as far as its offline growth reaches (what
		// the stage's growUnmounted made of it), else as far as a file
		// system it would make there. (One of another block size, a
		// block volume's mkfs, grows to its device.)
		if t, terr := ext4.GrowTarget(f, devBytes); terr == nil {
			want = t
		} else if want, err = ext4.Blocks(devBytes); err != nil {
			return err
		}
	}
	if want <= size.Blocks {
		return nil
	}
	klog.V(2).InfoS("resizing an image volume's file system", "path", path, "fs", fs, "from_blocks", size.Blocks, "to_blocks", want)
	err = fsops.GrowExt4(path, want)
	if errors.Is(err, unix.EPERM) {
		return StorageErr(ErrForbidden, "growing the file system at %s from %d to %d blocks needs CAP_SYS_RESOURCE, which this driver lacks: run its container privileged, as deploy/ does (%v)", path, size.Blocks, want, err)
	}
	return err
}
