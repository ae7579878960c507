package engine

import (
	"context"
	"fmt"
)

// The storage side of deleting, expanding and locking volumes: each
// answers in storage errors.

// DeleteVolume removes volume id under its lock (removeVolume). A
// malformed id or one with no record is already deleted: nil, nothing
// touched; a damaged record is refused, its data kept.
func (d *Engine) DeleteVolume(id string) error {
	v, unlock, err := lockForDelete(d, "volume", id, ValidVolumeID, VolIDKey, d.Records.Volumes)
	if err != nil || unlock == nil {
		return err
	}
	defer unlock()
	return d.removeVolume(v)
}

// removeVolume removes volume v, whose lock the caller holds: refused
// while it is mounted on this node or its pool is down; recorded
// deleting, its data removed durably, its record dropped.
func (d *Engine) removeVolume(v VolumeRecord) error {
	where, err := d.mountedAt(v)
	if err != nil {
		return err
	}
	if where != "" {
		return StorageErr(ErrInUse, "volume %s is still mounted at %s; unpublish and unstage it first", v.ID, where)
	}
	release := d.holdPools(v.Pool)
	defer release()
	// In a pool that is down the data cannot be reached: removing the
	// record alone would leave it owned by nothing once the disk is back.
	if err := d.volumePoolUp(v); err != nil {
		return err
	}
	v.Phase = PhaseDeleting
	if err := d.Records.Volumes.Put(v); err != nil {
		return fmt.Errorf("recording deletion of volume %s: %w", v.ID, err)
	}
	if err := d.removeVolumeData(v); err != nil {
		return fmt.Errorf("removing data of volume %s: %w", v.ID, err)
	}
	// A disk that went away meanwhile "removed" nothing: the record
	// stays deleting, and the pool finishes it when it is back.
	if err := d.volumePoolUp(v); err != nil {
		return err
	}
	if err := d.Records.Volumes.Drop(v.ID); err != nil {
		return fmt.Errorf("removing record of volume %s: %w", v.ID, err)
	}
	return nil
}

// ExpandVolume grows volume id to what cr asks, if that is more than it
// has, under its lock and unpinned (it may not be the source of a
// snapshot or clone in progress). A request below its size is satisfied
// already; a limit below it would be a shrink and is refused.
func (d *Engine) ExpandVolume(ctx context.Context, id string, cr SizeRange) (VolumeRecord, error) {
	v, unlock, err := d.lockVolume(id, true)
	if err != nil {
		return VolumeRecord{}, err
	}
	defer unlock()
	if lim := cr.Limit; lim > 0 && lim < v.CapacityBytes {
		return VolumeRecord{}, StorageErr(ErrOutOfRange, "volume %s has %d bytes; shrinking to limit_bytes %d is not supported", id, v.CapacityBytes, lim)
	}
	size, err := d.resolveSize(cr, v.AccessType, v.CapacityBytes)
	if err != nil {
		return VolumeRecord{}, err
	}
	if err := d.growsTo(v, size); err != nil {
		return VolumeRecord{}, err
	}
	if size > v.CapacityBytes {
		if err := d.layoutFor(v).grow(ctx, v, size); err != nil {
			return VolumeRecord{}, fmt.Errorf("expanding volume %s to %d bytes: %w", id, size, err)
		}
		v.CapacityBytes = size
		if err := d.Records.Volumes.Put(v); err != nil {
			return VolumeRecord{}, fmt.Errorf("recording the new size of volume %s: %w", id, err)
		}
	}
	return v, nil
}

// lockVolume takes a volume's lock and returns its record: NotFound (or
// ResourceExhausted for another node's id) if there is no ready volume.
// A change to the volume's data (expand) asks for unpinned: the volume
// must not be the source of a snapshot or clone in progress.
func (d *Engine) lockVolume(id string, unpinned bool) (VolumeRecord, func(), error) {
	lock := d.Locks.lock
	if unpinned {
		lock = d.Locks.lockUnpinned
	}
	unlock, err := lock("volume "+id, VolIDKey(id))
	if err != nil {
		return VolumeRecord{}, nil, err
	}
	v, ok := d.Records.Volumes.Get(id)
	if !ok || v.Phase != PhaseReady {
		unlock()
		return VolumeRecord{}, nil, d.NotFoundVolume(id)
	}
	return v, unlock, nil
}

// pinVolume checks that a volume is ready and pins it as the source of a
// snapshot or clone. Its lock is held only for the check: publish, stats
// and unpublish of the volume go on while it is copied, delete and expand
// wait until unpin is called.
func (d *Engine) pinVolume(id string) (VolumeRecord, func(), error) {
	v, unlock, err := d.lockVolume(id, false)
	if err != nil {
		return VolumeRecord{}, nil, err
	}
	defer unlock()
	if err := d.dataPresent(v); err != nil {
		return VolumeRecord{}, nil, err
	}
	return v, d.Locks.pin(VolIDKey(id)), nil
}

// pinSnapshot pins a snapshot as the source of a restore: other restores
// of it go on, its deletion waits.
func (d *Engine) pinSnapshot(id string) (func(), error) {
	unlock, err := d.Locks.lock("snapshot "+id, SnapIDKey(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	return d.Locks.pin(SnapIDKey(id)), nil
}

// growsTo refuses a growth of v to size that its layout cannot take: an
// image volume's file system (the one its image holds) has a largest size,
// and an image grown past it could never be staged again.
func (d *Engine) growsTo(v VolumeRecord, size int64) error {
	if !isImage(v) || size <= v.CapacityBytes {
		return nil
	}
	fs, err := d.ImageFS(v)
	if err != nil {
		return err
	}
	if _, maxSize := imageLimits(fs); size > maxSize {
		return StorageErr(ErrOutOfRange, "volume %s holds %s, which grows to at most %d bytes; %d asked", v.ID, fs, maxSize, size)
	}
	return nil
}
