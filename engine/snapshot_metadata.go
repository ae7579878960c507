package engine

import (
	"fmt"
	"os"

	"github.com/hostpath-csi/hostpath/fsops"
)

// What the SnapshotMetadata service reads of a snapshot of a block or an
// image volume: the ranges its image holds data in, and the ranges that
// differ between two of the same volume.

// DeltaBlock is the unit in which two snapshots are compared, and the
// size of a FIXED_LENGTH block of snapshot metadata.
const DeltaBlock = 4096

// BlockSnapshot is ready snapshot id, if it is an image (of a block or an
// image volume): ErrNotFound or ErrInvalid otherwise.
func (d *Engine) BlockSnapshot(id string) (SnapshotRecord, error) {
	s, ok := d.Records.Snapshots.Get(id)
	if !ok || s.Phase != PhaseReady {
		return SnapshotRecord{}, StorageErr(ErrNotFound, "snapshot %q does not exist", id)
	}
	if s.Format != FormatImage {
		return SnapshotRecord{}, StorageErr(ErrInvalid, "snapshot %s is of a directory volume; block metadata exists only for block and image volumes", id)
	}
	return s, nil
}

// AllocatedRanges are the ranges of snapshot s's image, from start, that
// hold data (SEEK_DATA/SEEK_HOLE).
func (d *Engine) AllocatedRanges(s SnapshotRecord, start int64) ([]fsops.Extent, error) {
	f, err := os.Open(d.SnapshotDataPath(s))
	if err != nil {
		return nil, fmt.Errorf("opening snapshot %s: %w", s.ID, err)
	}
	defer f.Close()
	exts, err := fsops.DataExtents(int(f.Fd()), start, s.VolumeBytes)
	if err != nil {
		return nil, fmt.Errorf("reading the extents of snapshot %s: %w", s.ID, err)
	}
	return exts, nil
}

// ChangedRanges are the DeltaBlock-aligned ranges, from start, where
// target's image differs from base's, two snapshots of one volume. Blocks
// the images share on disk (both cut by FICLONE, the volume not written
// there in between) are known unchanged without being read, so on pools
// that share blocks the comparison costs what changed; elsewhere it reads
// the data of both.
func (d *Engine) ChangedRanges(base, target SnapshotRecord, start int64) ([]fsops.Extent, error) {
	if base.SourceVolume != target.SourceVolume {
		return nil, StorageErr(ErrInvalid, "snapshots %s and %s are of different volumes", base.ID, target.ID)
	}
	a, err := os.Open(d.SnapshotDataPath(base))
	if err != nil {
		return nil, fmt.Errorf("opening snapshot %s: %w", base.ID, err)
	}
	defer a.Close()
	b, err := os.Open(d.SnapshotDataPath(target))
	if err != nil {
		return nil, fmt.Errorf("opening snapshot %s: %w", target.ID, err)
	}
	defer b.Close()
	changed, err := fsops.ChangedRanges(a, b, start, target.VolumeBytes, DeltaBlock)
	if err != nil {
		return nil, fmt.Errorf("comparing snapshots %s and %s: %w", base.ID, target.ID, err)
	}
	return changed, nil
}
