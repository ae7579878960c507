package engine

import (
	"fmt"
	"maps"
)

// Mutable parameters (VolumeAttributesClass). Each is stored with the
// volume and applied, not just accepted:
//   - kind moves the volume's reservation to another simulated --capacity
//     pool (refused with ResourceExhausted if that pool is full);
//   - snapshotFormat and snapshotCompression become the defaults for
//     snapshots of this volume whose VolumeSnapshotClass says nothing.
const (
	MutableKind                = "kind"
	MutableSnapshotFormat      = "snapshotFormat"
	MutableSnapshotCompression = "snapshotCompression"
)

// applyMutable merges new mutable parameters into a record (validated).
func applyMutable(v *VolumeRecord, params map[string]string) {
	if len(params) == 0 {
		return
	}
	if v.Mutable == nil {
		v.Mutable = map[string]string{}
	}
	maps.Copy(v.Mutable, params)
	if k, ok := params[MutableKind]; ok {
		v.Kind = k
	}
}

// ModifyVolume applies validated mutable parameters to volume id: a new
// capacity kind only if that kind has room for it (ErrNoCapacity).
func (d *Engine) ModifyVolume(id string, params map[string]string) error {
	v, unlock, err := d.lockVolume(id, false)
	if err != nil {
		return err
	}
	defer unlock()
	if k, ok := params[MutableKind]; ok && k != v.Kind {
		if err := d.Records.Volumes.Check(func(all map[string]VolumeRecord) error {
			var used int64
			for _, o := range all {
				if o.Kind == k {
					used += o.CapacityBytes
				}
			}
			if d.Config.Capacity[k]-used < v.CapacityBytes {
				return StorageErr(ErrNoCapacity, "capacity kind %q has %d bytes left, volume %s needs %d", k, d.Config.Capacity[k]-used, id, v.CapacityBytes)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	applyMutable(&v, params)
	if err := d.Records.Volumes.Put(v); err != nil {
		return fmt.Errorf("recording the parameters of volume %s: %w", id, err)
	}
	return nil
}
