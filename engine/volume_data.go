package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/hostpath-csi/hostpath/fsops"
)

// VolumeDataPath is where a volume's data lives: a directory for a mount
// volume, a backing file for a block volume.
func (d *Engine) VolumeDataPath(v VolumeRecord) string {
	if v.LocalPath != "" {
		return v.LocalPath
	}
	pl := d.PoolOf(v.Pool).Paths
	if fileBacked(v) {
		return filepath.Join(pl.Volumes(), v.ID+BlockSuffix)
	}
	return pl.VolumeDir(v.ID)
}

// createVolumeData makes the volume's data, empty or from its source;
// tag names the source's node when it is another one (createVolume
// decided).
func (d *Engine) createVolumeData(ctx context.Context, v VolumeRecord, tag string) error {
	if tag != "" {
		return d.pullVolumeData(ctx, v, tag)
	}
	if v.SourceSnapshot != "" || v.SourceVolume != "" {
		release, err := d.Heavy.Wait(ctx)
		if err != nil {
			return err
		}
		defer release()
		kind, expected := "clone", int64(0)
		if s, ok := d.Records.Snapshots.Get(v.SourceSnapshot); ok {
			kind, expected = "restore", s.SizeBytes
		} else if src, ok := d.Records.Volumes.Get(v.SourceVolume); ok {
			expected = d.expectedBytes(src)
		}
		var done func()
		ctx, done = d.track(ctx, kind, v.ID, expected)
		defer done()
	}
	if v.AccessType == AccessBlock {
		return d.createBlockData(ctx, v)
	}
	if isImage(v) {
		return d.createImageData(ctx, v)
	}
	dir := d.VolumeDataPath(v)
	if err := d.makeVolumeDir(v, dir); err != nil {
		return err
	}
	switch {
	case v.SourceSnapshot != "":
		return d.restoreSnapshot(ctx, v.SourceSnapshot, dir)
	case v.SourceVolume != "":
		src, ok := d.Records.Volumes.Get(v.SourceVolume)
		if !ok {
			return StorageErr(ErrNotFound, "source volume %s disappeared", v.SourceVolume)
		}
		st, err := fsops.CopyTree(ctx, d.VolumeDataPath(src), dir)
		d.moved("clone", st.Bytes)
		return err
	}
	return nil
}

// syncVolumeData makes a new directory volume's data durable before its
// record says ready: the directory (and its entry in volumes/), and for a
// restore or clone every file written into it, with one syncfs(2). The
// journal entry that says ready can otherwise reach the disk before them
// (an fdatasync of the journal's preallocated file flushes its data
// without committing the file system's metadata): make test-powerloss
// found ready volumes with no directory, and restores with no files, after
// a power loss on ext4. Block volumes are made durable as they are
// written (fsops.CreateDurable), or repaired at start when fresh; static
// local volumes are the operator's.
func (d *Engine) syncVolumeData(v VolumeRecord) error {
	if fileBacked(v) || v.LocalPath != "" {
		return nil
	}
	path := d.VolumeDataPath(v)
	if v.SourceSnapshot != "" || v.SourceVolume != "" {
		return fsops.SyncFS(path)
	}
	if err := fsops.SyncFile(path); err != nil {
		return err
	}
	return fsops.SyncDir(d.PoolOf(v.Pool).Paths.Volumes())
}

// mkdirOpen makes a volume directory any pod uid may write to, as with the
// reference driver; fsGroupPolicy File lets kubelet narrow that.
func mkdirOpen(dir string) error {
	if err := os.Mkdir(dir, 0o777); err != nil {
		return err
	}
	return os.Chmod(dir, 0o777)
}

// removeVolumeData removes whatever a volume has on disk; what is already
// gone is not an error.
func (d *Engine) removeVolumeData(v VolumeRecord) error {
	if v.LocalPath != "" {
		return nil // the operator's directory, never ours to remove
	}
	if fileBacked(v) {
		return d.removeBlockData(v)
	}
	// Durable before the record goes: a removal a power loss undid would
	// bring the data back owned by nothing.
	if err := fsops.RemoveAllDurable(d.VolumeDataPath(v)); err != nil {
		return err
	}
	if d.PoolOf(v.Pool).Get().Quota == QuotaProject && v.ProjectID != 0 {
		return d.setVolumeLimit(v, 0)
	}
	return nil
}

// growVolume gives a volume its new size on disk.
func (d *Engine) growVolume(ctx context.Context, v VolumeRecord, size int64) error {
	if fileBacked(v) {
		return d.growBlock(v, size)
	}
	return d.setVolumeLimit(v, size)
}

// mountedAt returns a staging or target path where the volume is mounted
// right now on this node, or "". Records of mounts that a reboot or an
// outside umount removed do not count. A path that cannot be inspected is
// an error, never "not mounted": callers remove data on that answer.
func (d *Engine) mountedAt(v VolumeRecord) (string, error) {
	for _, p := range mountPaths(v) {
		ours, err := d.ShowsVolume(p, v)
		if err != nil {
			return "", err
		}
		if ours {
			return p, nil
		}
	}
	return "", nil
}

// mountPaths lists the staging and target paths recorded for a volume.
func mountPaths(v VolumeRecord) []string {
	out := append([]string(nil), v.Staged...)
	for _, p := range v.Published {
		out = append(out, p.Target)
	}
	return out
}

// ShowsVolume reports whether path is a mount point showing this volume,
// decided by the mounted inode's identity, not by names. A path that does
// not exist shows nothing; any other failure to look is an error.
func (d *Engine) ShowsVolume(path string, v VolumeRecord) (bool, error) {
	_, ours, err := d.inspectMount(path, v)
	return ours, err
}

// mountShows reports whether a mount point shows this volume: the same
// directory inode, or the device of one of its loop devices.
func (d *Engine) mountShows(mp *fsops.MountPoint, v VolumeRecord) (bool, error) {
	if fileBacked(v) {
		devs, err := d.BlockDevices(v)
		if err != nil {
			return false, err
		}
		for _, dev := range devs {
			// A block volume's mount is its device node; an image
			// volume's, the file system on its device.
			shown := mp.Rdev
			if isImage(v) {
				shown = mp.Dev
			}
			if shown != 0 && shown == dev.Rdev {
				return true, nil
			}
		}
		return false, nil
	}
	dev, ino, _, err := fsops.Identity(d.VolumeDataPath(v))
	if err != nil {
		return false, err
	}
	return mp.Dev == dev && mp.Ino == ino, nil
}

// SnapshotDataPath is where a ready snapshot's data lives.
func (d *Engine) SnapshotDataPath(s SnapshotRecord) string {
	pl := d.PoolOf(s.Pool).Paths
	switch s.Format {
	case FormatImage:
		return filepath.Join(pl.Snapshots(), s.ID+BlockSuffix)
	case FormatReflink:
		return filepath.Join(pl.Snapshots(), s.ID)
	case FormatTarZst:
		return filepath.Join(pl.Snapshots(), s.ID+".tar.zst")
	}
	return pl.snapshotFile(s.ID)
}

// snapshotTempPath is where a snapshot is written before it is complete.
func (d *Engine) snapshotTempPath(s SnapshotRecord) string {
	return filepath.Join(d.PoolOf(s.Pool).Paths.Tmp(), s.ID+".partial")
}

func (d *Engine) removeSnapshotData(s SnapshotRecord) error {
	if err := fsops.RemoveAll(d.snapshotTempPath(s)); err != nil {
		return err
	}
	// Durable before the record goes (see removeVolumeData); what is
	// left in tmp/ is cleared at start.
	return fsops.RemoveAllDurable(d.SnapshotDataPath(s))
}

// DataPresent answers FailedPrecondition, naming the path, when a ready
// volume's data is missing (a disk not mounted yet, a directory moved
// away): the record is kept, and the volume serves again once the data is
// back.
func (d *Engine) DataPresent(v VolumeRecord) error {
	if err := d.volumePoolUp(v); err != nil {
		return err
	}
	return present("volume", v.ID, v.Name, d.VolumeDataPath(v))
}

// snapshotPresent is dataPresent for a snapshot.
func (d *Engine) snapshotPresent(s SnapshotRecord) error {
	if err := d.snapshotPoolUp(s); err != nil {
		return err
	}
	return present("snapshot", s.ID, s.Name, d.SnapshotDataPath(s))
}

// volumePoolUp is nil when the pool holding a volume's data is up (a
// static local volume's data is in no pool), else FailedPrecondition.
func (d *Engine) volumePoolUp(v VolumeRecord) error {
	if v.LocalPath != "" {
		return nil
	}
	_, err := d.usable(d.PoolOf(v.Pool))
	return err
}

// snapshotPoolUp is volumePoolUp for a snapshot.
func (d *Engine) snapshotPoolUp(s SnapshotRecord) error {
	_, err := d.usable(d.PoolOf(s.Pool))
	return err
}

func present(kind, id, name, path string) error {
	_, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return StorageErr(ErrDataMissing, "the data of %s %s (%s) is missing at %s: %v; mount or restore it there and retry", kind, id, name, path, err)
	case err != nil:
		return fmt.Errorf("the data of %s %s (%s) at %s cannot be looked at: %w", kind, id, name, path, err)
	}
	return nil
}

// expectedBytes is what copying a volume will move, where it can be known
// without walking the tree: a block volume's allocated bytes, a directory
// volume's project quota usage. 0 means not known.
func (d *Engine) expectedBytes(v VolumeRecord) int64 {
	if fileBacked(v) {
		if f, err := os.Open(d.VolumeDataPath(v)); err == nil {
			defer f.Close()
			if _, allocated, err := fsops.FileSize(f); err == nil {
				return allocated
			}
		}
		return 0
	}
	if p := d.PoolOf(v.Pool); p.Get().Quota == QuotaProject && v.ProjectID != 0 {
		if u, err := fsops.GetProjectUsage(p.Paths.Volumes(), v.ProjectID); err == nil {
			return u.UsedBytes
		}
	}
	return 0
}
