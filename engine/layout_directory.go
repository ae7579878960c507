package engine

import (
	"context"
	"fmt"
	"io"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
	"github.com/hostpath-csi/hostpath/transfer"
)

// directoryLayout is a mount volume kept as a directory in its pool
// (volumes/<id>), or the operator's directory of a static local volume:
// the reference driver's volume. Its capacity is a project quota where
// the pool has them; its snapshots are archives or reflinked trees, a
// file-by-file copy while pods write.
type directoryLayout struct{ *Engine }

func (d directoryLayout) createData(ctx context.Context, v VolumeRecord) error {
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

// syncData makes a new directory volume's data durable before its record
// says ready: the directory (and its entry in volumes/), and for a
// restore or clone every file written into it, with one syncfs(2). The
// journal entry that says ready can otherwise reach the disk before them
// (an fdatasync of the journal's preallocated file flushes its data
// without committing the file system's metadata): make test-powerloss
// found ready volumes with no directory, and restores with no files, after
// a power loss on ext4. Static local volumes are the operator's.
func (d directoryLayout) syncData(v VolumeRecord) error {
	if v.LocalPath != "" {
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

func (d directoryLayout) removeData(v VolumeRecord) error {
	if v.LocalPath != "" {
		return nil // the operator's directory, never ours to remove
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

func (d directoryLayout) grow(_ context.Context, v VolumeRecord, size int64) error {
	return d.setVolumeLimit(v, size)
}

func (d directoryLayout) stage(v VolumeRecord, staging string) error {
	return d.bindVolume(v, staging, 0, true)
}

func (d directoryLayout) mountSource(v VolumeRecord, _ bool) (string, *loop.Device, error) {
	return d.VolumeDataPath(v), nil, nil
}

func (directoryLayout) unmounted(*fsops.MountPoint, VolumeRecord) error { return nil }

// shows: a bind mount of the directory shows its inode.
func (d directoryLayout) shows(mp *fsops.MountPoint, v VolumeRecord) (bool, error) {
	dev, ino, _, err := fsops.Identity(d.VolumeDataPath(v))
	if err != nil {
		return false, err
	}
	return mp.Dev == dev && mp.Ino == ino, nil
}

// stats: the volume's own bytes and inodes against its capacity, and no
// more than its pool has free.
func (d directoryLayout) stats(v VolumeRecord, _ string) (volumeStats, error) {
	u, err := d.VolumeUsage(v)
	if err != nil {
		return volumeStats{}, fmt.Errorf("measuring volume %s: %w", v.ID, err)
	}
	fs, err := fsops.Statfs(d.VolumeDataPath(v))
	if err != nil {
		return volumeStats{}, fmt.Errorf("reading the file system of volume %s: %w", v.ID, err)
	}
	return volumeStats{
		Total:      v.CapacityBytes,
		Used:       u.Bytes,
		Available:  min(max(v.CapacityBytes-u.Bytes, 0), fs.AvailableBytes),
		InodesUsed: u.Inodes,
		InodesFree: fs.FreeInodes,
	}, nil
}

// resizeOnNode: a quota's new limit shows at once.
func (directoryLayout) resizeOnNode(VolumeRecord, string) error { return nil }

// expectedBytes: the project quota's usage, where the pool keeps one.
func (d directoryLayout) expectedBytes(v VolumeRecord) int64 {
	if p := d.PoolOf(v.Pool); p.Get().Quota == QuotaProject && v.ProjectID != 0 {
		if u, err := fsops.GetProjectUsage(p.Paths.Volumes(), v.ProjectID); err == nil {
			return u.UsedBytes
		}
	}
	return 0
}

// cutSnapshot: a reflinked copy is made with a group's other copies; an
// archive after them (a directory volume is never frozen: its snapshot is
// a file-by-file read).
func (d directoryLayout) cutSnapshot(ctx context.Context, v VolumeRecord, s SnapshotRecord, compact bool) (snapshotRest, error) {
	if s.Format == FormatReflink {
		// A reflinked copy is a tree, not one file: it has no checksum.
		size, err := d.writeReflinkSnapshot(ctx, v, s)
		return restDone(size, ""), err
	}
	return func(ctx context.Context, abort bool) (int64, string, error) {
		if abort {
			return 0, "", nil
		}
		return d.writeArchive(ctx, d.VolumeDataPath(v), s, compact)
	}, nil
}

// serve: the tree, archived as it is read.
func (d directoryLayout) serve(v VolumeRecord) (string, func(context.Context) (io.ReadCloser, error)) {
	path := d.VolumeDataPath(v)
	return WireTarZst, func(ctx context.Context) (io.ReadCloser, error) { return archiveOf(ctx, path), nil }
}

func (d directoryLayout) build(ctx context.Context, v VolumeRecord, m transfer.Meta, body io.Reader) error {
	if err := treeFormat(m); err != nil {
		return err
	}
	path := d.VolumeDataPath(v)
	if err := d.makeVolumeDir(v, path); err != nil {
		return err
	}
	return d.extractTree(ctx, m, body, path)
}
