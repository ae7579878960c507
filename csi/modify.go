package csi

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Mutable parameters (VolumeAttributesClass). Each is stored with the
// volume and applied, not just accepted:
//   - kind moves the volume's reservation to another simulated --capacity
//     pool (refused with ResourceExhausted if that pool is full);
//   - snapshotFormat and snapshotCompression become the defaults for
//     snapshots of this volume whose VolumeSnapshotClass says nothing.
const (
	mutableKind                = "kind"
	mutableSnapshotFormat      = "snapshotFormat"
	mutableSnapshotCompression = "snapshotCompression"
)

// checkMutable validates mutable parameters against what this driver can
// change on a live volume.
func (d *Driver) checkMutable(params map[string]string) error {
	for k, v := range params {
		if len(d.cfg.AcceptedMutableParameters) > 0 && !slices.Contains(d.cfg.AcceptedMutableParameters, k) {
			return invalid("mutable parameter %q is not accepted here; --accepted-mutable-parameter-names allows %s", k, strings.Join(d.cfg.AcceptedMutableParameters, ", "))
		}
		switch k {
		case mutableKind:
			if len(d.cfg.Capacity) == 0 {
				return invalid("mutable parameter %s=%q: no simulated capacity is configured (--capacity)", k, v)
			}
			if _, ok := d.cfg.Capacity[v]; !ok {
				return invalid("mutable parameter %s=%q names no configured --capacity kind", k, v)
			}
		case mutableSnapshotFormat:
			if _, _, _, err := d.snapshotOptions(map[string]string{paramFormat: v}, accessMount, nil); err != nil {
				return invalid("mutable parameter %s=%q: %s", k, v, err.Error())
			}
		case mutableSnapshotCompression:
			if _, _, _, err := d.snapshotOptions(map[string]string{paramCompression: v}, accessMount, nil); err != nil {
				return invalid("mutable parameter %s=%q: %s", k, v, err.Error())
			}
		default:
			keys := []string{mutableKind, mutableSnapshotFormat, mutableSnapshotCompression}
			sort.Strings(keys)
			return invalid("mutable parameter %q is not supported; this driver can change %s", k, strings.Join(keys, ", "))
		}
	}
	return nil
}

// applyMutable merges new mutable parameters into a record (validated).
func applyMutable(v *volumeRecord, params map[string]string) {
	if len(params) == 0 {
		return
	}
	if v.Mutable == nil {
		v.Mutable = map[string]string{}
	}
	maps.Copy(v.Mutable, params)
	if k, ok := params[mutableKind]; ok {
		v.Kind = k
	}
}

// ControllerModifyVolume changes a volume's mutable parameters.
func (d *Driver) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (_ *csi.ControllerModifyVolumeResponse, err error) {
	defer edge(&err)
	if !d.cfg.EnableModifyVolume {
		return nil, status.Error(codes.Unimplemented, "volume modification is disabled (start with --enable-controller-modify-volume)")
	}
	id := req.GetVolumeId()
	if err := d.checkIDHere("volume_id", id); err != nil {
		return nil, err
	}
	if err := d.checkMutable(req.GetMutableParameters()); err != nil {
		return nil, err
	}
	if err := d.modifyVolume(id, req.GetMutableParameters()); err != nil {
		return nil, err
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}

// modifyVolume applies validated mutable parameters to volume id: a new
// capacity kind only if that kind has room for it (ErrNoCapacity).
func (d *engine) modifyVolume(id string, params map[string]string) error {
	v, unlock, err := d.lockVolume(id, false)
	if err != nil {
		return err
	}
	defer unlock()
	if k, ok := params[mutableKind]; ok && k != v.Kind {
		if err := d.st.Volumes.Check(func(all map[string]volumeRecord) error {
			var used int64
			for _, o := range all {
				if o.Kind == k {
					used += o.CapacityBytes
				}
			}
			if d.cfg.Capacity[k]-used < v.CapacityBytes {
				return storageErr(ErrNoCapacity, "capacity kind %q has %d bytes left, volume %s needs %d", k, d.cfg.Capacity[k]-used, id, v.CapacityBytes)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	applyMutable(&v, params)
	if err := d.st.Volumes.Put(v); err != nil {
		return fmt.Errorf("recording the parameters of volume %s: %w", id, err)
	}
	return nil
}
