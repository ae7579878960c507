package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
)

// NodeStageVolume bind-mounts a directory volume at the staging path. A
// block volume needs no staging mount: its loop device already exists.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (_ *csi.NodeStageVolumeResponse, err error) {
	defer edge(&err)
	// The engine checks that the volume is this node's once a standby
	// copy kept here has been promoted.
	r, staging, err := d.mountRequest(false, req.GetVolumeId(), "staging_target_path", req.GetStagingTargetPath(), req.GetVolumeCapability(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	if err := d.eng.Stage(ctx, req.GetVolumeId(), staging, r); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// mountRequest is what NodeStageVolume and NodePublishVolume check
// first: the id (of this node if here), the path and the capability,
// whose access type and file system become the engine's request with the
// volume context.
func (d *Driver) mountRequest(here bool, id, pathField, path string, c *csi.VolumeCapability, vctx map[string]string) (engine.MountRequest, string, error) {
	check := checkID
	if here {
		check = d.checkIDHere
	}
	if err := check("volume_id", id); err != nil {
		return engine.MountRequest{}, "", err
	}
	path, err := d.checkCOPath(pathField, path)
	if err != nil {
		return engine.MountRequest{}, "", err
	}
	if c == nil {
		return engine.MountRequest{}, "", invalid("volume_capability is required")
	}
	access, err := capabilityAccessType(c)
	if err != nil {
		return engine.MountRequest{}, "", err
	}
	fsType, err := checkImageFS(c)
	if err != nil {
		return engine.MountRequest{}, "", err
	}
	if vctx[engine.CtxEphemeral] == "true" || vctx[engine.CtxLocalPath] != "" {
		// The CO's id of an inline or local volume becomes its name.
		if err := checkName("volume_id", id); err != nil {
			return engine.MountRequest{}, "", err
		}
	}
	return engine.MountRequest{Access: access, FSType: fsType, Context: vctx}, path, nil
}

// checkUnmount is what NodeUnstageVolume and NodeUnpublishVolume check
// first: the id and the path.
func (d *Driver) checkUnmount(id, pathField, path string) (string, error) {
	if err := d.checkIDHere("volume_id", id); err != nil {
		return "", err
	}
	return d.checkCOPath(pathField, path)
}

// NodeUnstageVolume undoes NodeStageVolume. A staging path that is not
// mounted is already unstaged.
func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (_ *csi.NodeUnstageVolumeResponse, err error) {
	defer edge(&err)
	staging, err := d.checkUnmount(req.GetVolumeId(), "staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	if err := d.eng.UnstageVolume(req.GetVolumeId(), staging); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the volume at the target path, read-only
// and with the capability's mount flags where asked.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (_ *csi.NodePublishVolumeResponse, err error) {
	defer edge(&err)
	if req.GetStagingTargetPath() != "" {
		if _, err := d.checkCOPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
			return nil, err
		}
	}
	c := req.GetVolumeCapability()
	r, target, err := d.mountRequest(true, req.GetVolumeId(), "target_path", req.GetTargetPath(), c, req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	flags, _ := fsops.ParseMountOptions(c.GetMount().GetMountFlags())
	mode := c.GetAccessMode().GetMode()
	readOnly := req.GetReadonly() || mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	if readOnly {
		flags |= fsops.ReadOnly
	}
	single := mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	if err := d.eng.Publish(ctx, req.GetVolumeId(), target, r, flags, readOnly, single); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts the target and removes it. A target that
// is not mounted is already unpublished.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (_ *csi.NodeUnpublishVolumeResponse, err error) {
	defer edge(&err)
	target, err := d.checkUnmount(req.GetVolumeId(), "target_path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	if err := d.eng.UnpublishVolume(req.GetVolumeId(), target); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetInfo names this node, its volume limit and its topology.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{NodeId: d.eng.Config.NodeID, MaxVolumesPerNode: d.eng.Config.MaxVolumesPerNode}
	if d.eng.Config.EnableTopology {
		resp.AccessibleTopology = d.nodeTopology()
	}
	return resp, nil
}

// NodeGetCapabilities lists what the node service does.
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	types := []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
	}
	if d.eng.Config.NodeExpansion() {
		types = append(types, csi.NodeServiceCapability_RPC_EXPAND_VOLUME)
	}
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, t := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// NodeGetVolumeStats reports this volume's own usage (not the host file
// system's): the bytes and inodes in its tree against its capacity, or a
// block volume's device size.
func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (_ *csi.NodeGetVolumeStatsResponse, err error) {
	defer edge(&err)
	if err := d.checkIDHere("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetVolumePath() == "" {
		return nil, invalid("volume_path is required")
	}
	u, err := d.eng.VolumeStats(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	if u.Block {
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: u.Total}}}, nil
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: u.Total, Used: u.Used, Available: u.Available},
		{Unit: csi.VolumeUsage_INODES, Total: u.InodesUsed + u.InodesFree, Used: u.InodesUsed, Available: u.InodesFree},
	}}, nil
}

// NodeExpandVolume makes the node see a volume's new size: a block
// volume's loop device re-reads its file's size; a directory volume has
// nothing to do on the node. With controller expansion switched off
// (--disable-controller-expansion) it grows the volume itself, up to
// --max-volume-size-node.
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (_ *csi.NodeExpandVolumeResponse, err error) {
	defer edge(&err)
	if !d.eng.Config.NodeExpansion() {
		return nil, status.Error(codes.Unimplemented, "node expansion is disabled (--enable-volume-expansion=false or --disable-node-expansion)")
	}
	if err := d.checkIDHere("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetVolumePath() == "" {
		return nil, invalid("volume_path is required")
	}
	want := req.GetCapacityRange().GetRequiredBytes()
	if want > d.eng.Config.MaxVolumeSizeNode {
		return nil, status.Errorf(codes.OutOfRange, "required_bytes %d exceeds the largest size a node may expand a volume to (--max-volume-size-node %d)", want, d.eng.Config.MaxVolumeSizeNode)
	}
	size, err := d.eng.ExpandOnNode(ctx, req.GetVolumeId(), req.GetVolumePath(), rangeOf(req.GetCapacityRange()))
	if err != nil {
		return nil, err
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
