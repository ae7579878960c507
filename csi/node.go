package csi

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
)

// nodeVolume takes the volume's lock and returns its record.
func (d *engine) nodeVolume(id string) (volumeRecord, func(), error) {
	return d.nodeVolumeOrProvision(context.Background(), id, nil, "")
}

// nodeVolumeOrProvision is nodeVolume, but brings an inline or local
// volume the volume context describes into being if it is not there yet
// (with no context it answers NotFound).
func (d *engine) nodeVolumeOrProvision(ctx context.Context, id string, vctx map[string]string, access string) (volumeRecord, func(), error) {
	unlock, err := d.locks.lock("volume "+id, volIDKey(id))
	if err != nil {
		return volumeRecord{}, nil, err
	}
	if v, ok := d.lookupNodeVolume(id); ok {
		return v, unlock, nil
	}
	v, err := d.provisionOnNode(ctx, id, vctx, access)
	if err != nil {
		unlock()
		return volumeRecord{}, nil, err
	}
	return v, unlock, nil
}

// mountSource is what gets bind-mounted for a volume: its directory, or
// the device node of its loop device (a read-only device of its own for a
// read-only publication, returned too so a failed mount can let it go).
func (d *engine) mountSource(v volumeRecord, readOnly bool) (string, *loop.Device, error) {
	if v.AccessType == accessMount {
		return d.volumeDataPath(v), nil, nil
	}
	if readOnly {
		dev, err := d.readOnlyBlockDevice(v)
		return dev.Path(), &dev, err
	}
	dev, err := d.attachBlock(v)
	return dev.Path(), nil, err
}

// NodeStageVolume bind-mounts a directory volume at the staging path. A
// block volume needs no staging mount: its loop device already exists.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (_ *csi.NodeStageVolumeResponse, err error) {
	defer edge(&err)
	v, staging, unlock, err := d.lockForMount(ctx, req.GetVolumeId(), "staging_target_path", req.GetStagingTargetPath(), req.GetVolumeCapability(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := d.stageVolume(v, staging); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// lockForMount is what NodeStageVolume and NodePublishVolume do first:
// check the id, the path and the capability, then lock the volume (made
// first if the volume context describes an inline or local one) and check
// that it is of the capability's access type and its data is there.
func (d *Driver) lockForMount(ctx context.Context, id, pathField, path string, c *csi.VolumeCapability, vctx map[string]string) (volumeRecord, string, func(), error) {
	if err := d.checkIDHere("volume_id", id); err != nil {
		return volumeRecord{}, "", nil, err
	}
	path, err := d.checkCOPath(pathField, path)
	if err != nil {
		return volumeRecord{}, "", nil, err
	}
	if c == nil {
		return volumeRecord{}, "", nil, invalid("volume_capability is required")
	}
	access, err := capabilityAccessType(c)
	if err != nil {
		return volumeRecord{}, "", nil, err
	}
	if vctx[ctxEphemeral] == "true" || vctx[ctxLocalPath] != "" {
		// The CO's id of an inline or local volume becomes its name.
		if err := checkName("volume_id", id); err != nil {
			return volumeRecord{}, "", nil, err
		}
	}
	v, unlock, err := d.nodeVolumeOrProvision(ctx, id, vctx, access)
	if err != nil {
		return volumeRecord{}, "", nil, err
	}
	if access != v.AccessType {
		unlock()
		return volumeRecord{}, "", nil, invalid("volume %s is a %s volume; the capability asks for %s", v.ID, v.AccessType, access)
	}
	if err := d.dataPresent(v); err != nil {
		unlock()
		return volumeRecord{}, "", nil, err
	}
	return v, path, unlock, nil
}

// checkUnmount is what NodeUnstageVolume and NodeUnpublishVolume check
// first: the id and the path.
func (d *Driver) checkUnmount(id, pathField, path string) (string, error) {
	if err := d.checkIDHere("volume_id", id); err != nil {
		return "", err
	}
	return d.checkCOPath(pathField, path)
}

// inspectMount returns the mount at path (nil if there is none) and
// whether it shows the volume.
func (d *engine) inspectMount(path string, v volumeRecord) (*fsops.MountPoint, bool, error) {
	mp, err := d.mountPoint(path)
	if err != nil && !os.IsNotExist(err) {
		return nil, false, storageErr(ErrUnsure, "cannot tell whether volume %s is mounted at %s: %v; nothing was changed, retry once the path can be inspected", v.ID, path, err)
	}
	if mp == nil {
		return nil, false, nil
	}
	ours, err := d.mountShows(mp, v)
	if err != nil {
		return nil, false, storageErr(ErrUnsure, "cannot tell whether %s (%s on %s) shows volume %s: %v; nothing was changed, retry once the volume's data can be inspected", path, mp.Source, mp.Root, v.ID, err)
	}
	return mp, ours, nil
}

// bindVolume mounts the volume at path unless it is already there. A
// different mount at path is FailedPrecondition; path is created (a
// directory, or a file for a block volume) if it does not exist.
func (d *engine) bindVolume(v volumeRecord, path string, flags uintptr, dir bool) error {
	mp, ours, err := d.inspectMount(path, v)
	if err != nil {
		return err
	}
	if mp != nil {
		if !ours {
			return storageErr(ErrInUse, "%s already has another mount (%s on %s); it cannot also show volume %s", path, mp.Source, mp.Root, v.ID)
		}
		if mp.ReadOnly != (flags&fsops.ReadOnly != 0) {
			return storageErr(ErrExists, "volume %s is already mounted at %s with read-only=%v; the request asks read-only=%v", v.ID, path, mp.ReadOnly, !mp.ReadOnly)
		}
		return nil
	}
	if err := fsops.MakeMountPoint(path, dir); err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	src, roDev, err := d.mountSource(v, flags&fsops.ReadOnly != 0)
	if err != nil {
		return fmt.Errorf("finding the source of volume %s: %w", v.ID, err)
	}
	if err := fsops.BindMount(src, path, flags); err != nil {
		if roDev != nil {
			_ = loop.Detach(*roDev)
		}
		return fmt.Errorf("mounting volume %s at %s: %w", v.ID, path, err)
	}
	return nil
}

// NodeUnstageVolume undoes NodeStageVolume. A staging path that is not
// mounted is already unstaged.
func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (_ *csi.NodeUnstageVolumeResponse, err error) {
	defer edge(&err)
	staging, err := d.checkUnmount(req.GetVolumeId(), "staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	if err := d.unstageVolume(req.GetVolumeId(), staging); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// unbindVolume unmounts the volume from path if it is mounted there, and
// removes path if asked. A mount of something else is refused.
func (d *engine) unbindVolume(v volumeRecord, path string, remove bool) error {
	mp, ours, err := d.inspectMount(path, v)
	if err != nil {
		return err
	}
	if mp != nil {
		if !ours {
			return storageErr(ErrInUse, "%s shows another mount (%s on %s), not volume %s; not unmounting it", path, mp.Source, mp.Root, v.ID)
		}
		if err := fsops.Unmount(path); err != nil {
			return fmt.Errorf("unmounting %s: %w", path, err)
		}
		if v.AccessType == accessBlock {
			if err := d.releaseBlockDevice(mp.Rdev, v); err != nil {
				return fmt.Errorf("detaching the read-only device of volume %s: %w", v.ID, err)
			}
		}
	}
	if remove {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("removing %s: %w", path, err)
		}
	}
	return nil
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
	v, target, unlock, err := d.lockForMount(ctx, req.GetVolumeId(), "target_path", req.GetTargetPath(), c, req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	defer unlock()
	flags, _ := fsops.ParseMountOptions(c.GetMount().GetMountFlags())
	mode := c.GetAccessMode().GetMode()
	readOnly := req.GetReadonly() || mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	if readOnly {
		flags |= fsops.ReadOnly
	}
	single := mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	if err := d.publishVolume(v, target, flags, readOnly, single); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// publishVolume shows volume v, whose lock the caller holds, at target:
// refused while another target holds it single-writer; the publication
// recorded before the mount (a crash after it still knows the target).
func (d *engine) publishVolume(v volumeRecord, target string, flags uintptr, readOnly, single bool) error {
	for _, p := range v.Published {
		if p.Target == target || !(single || p.SingleWriter) {
			continue
		}
		ours, err := d.showsVolume(p.Target, v)
		if err != nil {
			return err
		}
		if ours {
			return storageErr(ErrInUse, "volume %s is SINGLE_NODE_SINGLE_WRITER and already published at %s", v.ID, p.Target)
		}
	}
	if err := d.settleBlock(&v); err != nil {
		return fmt.Errorf("making the backing file of volume %s durable: %w", v.ID, err)
	}
	if !slices.ContainsFunc(v.Published, func(p publication) bool { return p.Target == target }) {
		v.Published = append(v.Published, publication{Target: target, ReadOnly: readOnly, SingleWriter: single})
		if err := d.st.Volumes.Put(v); err != nil {
			return fmt.Errorf("recording publication of volume %s: %w", v.ID, err)
		}
	}
	if err := d.bindVolume(v, target, flags, v.AccessType == accessMount); err != nil {
		if nodeCreated(v) {
			v.Published = slices.DeleteFunc(v.Published, func(p publication) bool { return p.Target == target })
			if rerr := d.releaseNodeCreated(v); rerr != nil {
				klog.ErrorS(rerr, "releasing an inline or local volume whose publish failed; the next start clears it", "volume_id", v.ID)
			}
		}
		return err
	}
	return nil
}

// NodeUnpublishVolume unmounts the target and removes it. A target that
// is not mounted is already unpublished.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (_ *csi.NodeUnpublishVolumeResponse, err error) {
	defer edge(&err)
	target, err := d.checkUnmount(req.GetVolumeId(), "target_path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	if err := d.unpublishVolume(req.GetVolumeId(), target); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetInfo names this node, its volume limit and its topology.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{NodeId: d.cfg.NodeID, MaxVolumesPerNode: d.cfg.MaxVolumesPerNode}
	if d.cfg.EnableTopology {
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
	if d.cfg.nodeExpansion() {
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
	u, err := d.volumeStats(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	if u.block {
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: u.total}}}, nil
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: u.total, Used: u.used, Available: u.available},
		{Unit: csi.VolumeUsage_INODES, Total: u.inodesUsed + u.inodesFree, Used: u.inodesUsed, Available: u.inodesFree},
	}}, nil
}

// NodeExpandVolume makes the node see a volume's new size: a block
// volume's loop device re-reads its file's size; a directory volume has
// nothing to do on the node. With controller expansion switched off
// (--disable-controller-expansion) it grows the volume itself, up to
// --max-volume-size-node.
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (_ *csi.NodeExpandVolumeResponse, err error) {
	defer edge(&err)
	if !d.cfg.nodeExpansion() {
		return nil, status.Error(codes.Unimplemented, "node expansion is disabled (--enable-volume-expansion=false or --disable-node-expansion)")
	}
	if err := d.checkIDHere("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetVolumePath() == "" {
		return nil, invalid("volume_path is required")
	}
	want := req.GetCapacityRange().GetRequiredBytes()
	if want > d.cfg.MaxVolumeSizeNode {
		return nil, status.Errorf(codes.OutOfRange, "required_bytes %d exceeds the largest size a node may expand a volume to (--max-volume-size-node %d)", want, d.cfg.MaxVolumeSizeNode)
	}
	size, err := d.expandOnNode(ctx, req.GetVolumeId(), req.GetVolumePath(), rangeOf(req.GetCapacityRange()))
	if err != nil {
		return nil, err
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
