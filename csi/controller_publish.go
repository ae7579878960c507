package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ControllerPublishVolume "attaches" a volume to its node. A node-local
// volume can only be attached to the node it lives on; the attachment is
// recorded so ListVolumes can report it and a conflicting read-only flag is
// caught, as the spec asks.
func (d *Driver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (_ *csi.ControllerPublishVolumeResponse, err error) {
	defer edge(&err)
	if !d.eng.Config.EnableAttach {
		return nil, status.Error(codes.Unimplemented, "attach is disabled (start with --enable-attach)")
	}
	id, node := req.GetVolumeId(), req.GetNodeId()
	if err := d.checkIDHere("volume_id", id); err != nil {
		return nil, err
	}
	if err := checkID("node_id", node); err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() == nil {
		return nil, invalid("volume_capability is required")
	}
	access, err := capabilityAccessType(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if err := d.eng.AttachVolume(id, node, access, req.GetReadonly()); err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{}, nil
}

// ControllerUnpublishVolume detaches; what is not attached is success.
func (d *Driver) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (_ *csi.ControllerUnpublishVolumeResponse, err error) {
	defer edge(&err)
	if !d.eng.Config.EnableAttach {
		return nil, status.Error(codes.Unimplemented, "attach is disabled (start with --enable-attach)")
	}
	id := req.GetVolumeId()
	if err := d.checkIDHere("volume_id", id); err != nil {
		return nil, err
	}
	if err := d.eng.DetachVolume(id, req.GetNodeId()); err != nil {
		return nil, err
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}
