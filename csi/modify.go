package csi

import (
	"context"
	"slices"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkMutable validates mutable parameters against what this driver can
// change on a live volume.
func (d *Driver) checkMutable(params map[string]string) error {
	for k, v := range params {
		if len(d.eng.Config.AcceptedMutableParameters) > 0 && !slices.Contains(d.eng.Config.AcceptedMutableParameters, k) {
			return invalid("mutable parameter %q is not accepted here; --accepted-mutable-parameter-names allows %s", k, strings.Join(d.eng.Config.AcceptedMutableParameters, ", "))
		}
		switch k {
		case engine.MutableKind:
			if len(d.eng.Config.Capacity) == 0 {
				return invalid("mutable parameter %s=%q: no simulated capacity is configured (--capacity)", k, v)
			}
			if _, ok := d.eng.Config.Capacity[v]; !ok {
				return invalid("mutable parameter %s=%q names no configured --capacity kind", k, v)
			}
		case engine.MutableSnapshotFormat:
			if _, _, _, err := d.eng.SnapshotOptions(map[string]string{engine.ParamFormat: v}, engine.LayoutDirectory, nil); err != nil {
				return invalid("mutable parameter %s=%q: %s", k, v, err.Error())
			}
		case engine.MutableSnapshotCompression:
			if _, _, _, err := d.eng.SnapshotOptions(map[string]string{engine.ParamCompression: v}, engine.LayoutDirectory, nil); err != nil {
				return invalid("mutable parameter %s=%q: %s", k, v, err.Error())
			}
		case engine.MutableReadIOPS, engine.MutableWriteIOPS, engine.MutableReadBPS, engine.MutableWriteBPS:
			if err := engine.CheckIOLimit(k, v); err != nil {
				return invalid("%s", err.Error())
			}
		default:
			keys := []string{engine.MutableKind, engine.MutableSnapshotFormat, engine.MutableSnapshotCompression,
				engine.MutableReadIOPS, engine.MutableWriteIOPS, engine.MutableReadBPS, engine.MutableWriteBPS}
			sort.Strings(keys)
			return invalid("mutable parameter %q is not supported; this driver can change %s", k, strings.Join(keys, ", "))
		}
	}
	return nil
}

// ControllerModifyVolume changes a volume's mutable parameters.
func (d *Driver) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (_ *csi.ControllerModifyVolumeResponse, err error) {
	defer edge(&err)
	if !d.eng.Config.EnableModifyVolume {
		return nil, status.Error(codes.Unimplemented, "volume modification is disabled (start with --enable-controller-modify-volume)")
	}
	id := req.GetVolumeId()
	if err := d.checkIDHere("volume_id", id); err != nil {
		return nil, err
	}
	if err := d.checkMutable(req.GetMutableParameters()); err != nil {
		return nil, err
	}
	if err := d.eng.ModifyVolume(id, req.GetMutableParameters()); err != nil {
		return nil, err
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}
