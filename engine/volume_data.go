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
			expected = d.layoutFor(src).expectedBytes(src)
		}
		var done func()
		ctx, done = d.track(ctx, kind, v.ID, expected)
		defer done()
	}
	return d.layoutFor(v).createData(ctx, v)
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
	if err := d.layoutFor(v).removeData(v); err != nil {
		return err
	}
	// The cuts kept for its standby go with it (none for most volumes).
	return d.dropStandbyCuts(v)
}

// mountedAt returns a staging or target path where the volume is mounted
// right now on this node, or "". Records of mounts that a reboot or an
// outside umount removed do not count. A path that cannot be inspected is
// an error, never "not mounted": callers remove data on that answer.
func (d *Engine) mountedAt(v VolumeRecord) (string, error) {
	p, _, err := d.mountedDev(v)
	return p, err
}

// mountedDev is mountedAt with the device of the file system mounted
// there (st_dev of the mount's root).
func (d *Engine) mountedDev(v VolumeRecord) (string, uint64, error) {
	for _, p := range mountPaths(v) {
		mp, ours, err := d.inspectMount(p, v)
		if err != nil {
			return "", 0, err
		}
		if ours {
			return p, mp.Dev, nil
		}
	}
	return "", 0, nil
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

// dataPresent answers FailedPrecondition, naming the path, when a ready
// volume's data is missing (a disk not mounted yet, a directory moved
// away): the record is kept, and the volume serves again once the data is
// back.
func (d *Engine) dataPresent(v VolumeRecord) error {
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
