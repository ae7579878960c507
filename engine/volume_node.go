package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
)

// The storage side of the Node service: each handler, once it has checked
// its request and locked the volume, makes one of these calls, which
// answer in storage errors.

// stageVolume shows volume v, whose lock the caller holds, at the staging
// path: a directory volume bind-mounted there, a block volume's loop
// device attached (it needs no staging mount). The staging is recorded
// before the mount.
func (d *Engine) stageVolume(v VolumeRecord, staging string) error {
	if err := d.settleBlock(&v); err != nil {
		return fmt.Errorf("making the backing file of volume %s durable: %w", v.ID, err)
	}
	if !slices.Contains(v.Staged, staging) {
		v.Staged = append(v.Staged, staging)
		if err := d.Records.Volumes.Put(v); err != nil {
			return fmt.Errorf("recording staging of volume %s: %w", v.ID, err)
		}
	}
	return d.layoutFor(v).stage(v, staging)
}

// UnstageVolume undoes stageVolume: a staging path that is not mounted is
// already unstaged. An inline or local volume no target or staging path
// holds any more is released.
func (d *Engine) UnstageVolume(id, staging string) error {
	v, unlock, err := d.nodeVolume(id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := d.unbindVolume(v, staging, false); err != nil {
		return err
	}
	if i := slices.Index(v.Staged, staging); i >= 0 {
		v.Staged = slices.Delete(v.Staged, i, i+1)
		if err := d.Records.Volumes.Put(v); err != nil {
			return fmt.Errorf("recording unstaging of volume %s: %w", v.ID, err)
		}
	}
	if err := d.releaseNodeCreated(v); err != nil {
		return fmt.Errorf("releasing volume %s: %w", id, err)
	}
	return nil
}

// UnpublishVolume unmounts the volume from target and removes target; a
// target that is not mounted is already unpublished. Of a volume that is
// gone, an empty target is cleaned up and a mounted one left alone.
func (d *Engine) UnpublishVolume(id, target string) error {
	v, unlock, err := d.nodeVolume(id)
	if errors.Is(err, ErrNotFound) {
		if mp, inspectErr := d.MountPoint(target); mp != nil || (inspectErr != nil && !os.IsNotExist(inspectErr)) {
			return err
		}
		if rmErr := os.Remove(target); rmErr != nil && !os.IsNotExist(rmErr) {
			return fmt.Errorf("removing %s: %w", target, rmErr)
		}
		return nil
	}
	if err != nil {
		return err
	}
	defer unlock()
	if err := d.unbindVolume(v, target, true); err != nil {
		return err
	}
	if i := slices.IndexFunc(v.Published, func(p publication) bool { return p.Target == target }); i >= 0 {
		v.Published = slices.Delete(v.Published, i, i+1)
		if err := d.Records.Volumes.Put(v); err != nil {
			return fmt.Errorf("recording unpublication of volume %s: %w", v.ID, err)
		}
	}
	if err := d.releaseNodeCreated(v); err != nil {
		return fmt.Errorf("removing inline volume %s: %w", id, err)
	}
	return nil
}

// volumeUsage is a volume's own usage: a block volume's device size, or a
// directory volume's bytes and inodes against its capacity.
type volumeStats struct {
	Block                  bool
	Total, Used, Available int64
	InodesUsed, InodesFree int64
}

// VolumeStats measures the ready volume id mounted at path.
func (d *Engine) VolumeStats(id, path string) (volumeStats, error) {
	v, ok := d.Records.Volumes.Get(id)
	if !ValidVolumeID(id) || !ok || v.Phase != PhaseReady {
		return volumeStats{}, d.NotFoundVolume(id)
	}
	if err := d.mountedHere(v, path); err != nil {
		return volumeStats{}, err
	}
	return d.layoutFor(v).stats(v, path)
}

// mountedHere answers NotFound unless path shows volume v.
func (d *Engine) mountedHere(v VolumeRecord, path string) error {
	ours, err := d.ShowsVolume(path, v)
	if err != nil {
		return err
	}
	if !ours {
		return StorageErr(ErrNotFound, "volume %s is not mounted at %s", v.ID, path)
	}
	return nil
}

// ExpandOnNode makes the node see volume id's new size (a block volume's
// loop device re-reads its file's size) and, with controller expansion
// switched off, grows the volume to what cr asks first. It returns the
// volume's size.
func (d *Engine) ExpandOnNode(ctx context.Context, id, path string, cr SizeRange) (int64, error) {
	v, unlock, err := d.nodeVolume(id)
	if err != nil {
		return 0, err
	}
	defer unlock()
	if err := d.mountedHere(v, path); err != nil {
		return 0, err
	}
	if cr.Required > v.CapacityBytes && !d.Config.ControllerExpansion() {
		if d.Locks.Pinned(VolIDKey(v.ID)) {
			return 0, StorageErr(ErrBusy, "volume %s is the source of a snapshot or clone in progress; expand it once that is done", v.ID)
		}
		size, err := d.resolveSize(cr, v.AccessType, v.CapacityBytes)
		if err != nil {
			return 0, err
		}
		if err := d.growsTo(v, size); err != nil {
			return 0, err
		}
		if err := d.layoutFor(v).grow(ctx, v, size); err != nil {
			return 0, fmt.Errorf("expanding volume %s to %d bytes: %w", v.ID, size, err)
		}
		v.CapacityBytes = size
		if err := d.Records.Volumes.Put(v); err != nil {
			return 0, fmt.Errorf("recording the new size of volume %s: %w", v.ID, err)
		}
	}
	if err := d.layoutFor(v).resizeOnNode(v, path); err != nil {
		return 0, err
	}
	return v.CapacityBytes, nil
}
