package engine

import (
	"fmt"
	"maps"

	"k8s.io/klog/v2"
)

// Mutable parameters (VolumeAttributesClass). Each is stored with the
// volume and applied, not just accepted:
//   - kind moves the volume's reservation to another simulated --capacity
//     pool (refused with ResourceExhausted if that pool is full);
//   - snapshotFormat and snapshotCompression become the defaults for
//     snapshots of this volume whose VolumeSnapshotClass says nothing;
//   - readIOPS, writeIOPS, readBytesPerSecond and writeBytesPerSecond
//     throttle an image or block volume's device in its pods' cgroups
//     (iolimits.go).
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
	if err := checkIOLimitsFor(v, params); err != nil {
		return err
	}
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
	nv := v
	nv.Mutable = maps.Clone(v.Mutable)
	applyMutable(&nv, params)
	// New I/O limits go to the pods that publish the volume first, and
	// are recorded only once they are there: a limit that cannot be set
	// (a pod gone, a cgroup that cannot be written) leaves the old ones,
	// in the cgroups and in the record.
	old, l := ioLimitsOf(v.Mutable), ioLimitsOf(nv.Mutable)
	d.ioMu.Lock()
	defer d.ioMu.Unlock()
	if l != old && len(v.Published) > 0 {
		if err := d.applyIOLimits(v, v.Published, l, old); err != nil {
			return err
		}
	}
	if err := d.Records.Volumes.Put(nv); err != nil {
		if l != old && len(v.Published) > 0 {
			if uerr := d.applyIOLimits(v, v.Published, old, l); uerr != nil {
				klog.ErrorS(uerr, "putting back a volume's I/O limits after its record failed", "volume_id", id)
			}
		}
		return fmt.Errorf("recording the parameters of volume %s: %w", id, err)
	}
	return nil
}
