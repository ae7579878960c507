package csi

import (
	"context"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The GroupController service: VolumeGroupSnapshots, all or nothing. The
// member snapshots are taken one after another with every member volume
// locked, so no CSI call changes any of them in between; writes by pods
// are not frozen (there is no fsfreeze without a file system per volume).

// GroupControllerGetCapabilities advertises group snapshots.
func (d *Driver) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT}},
	}}}, nil
}

func (d *Driver) csiGroup(g engine.GroupRecord) *csi.VolumeGroupSnapshot {
	out := &csi.VolumeGroupSnapshot{GroupSnapshotId: g.ID, CreationTime: timestamppb.New(g.CreatedAt), ReadyToUse: g.Phase == engine.PhaseReady}
	for _, id := range g.Snapshots {
		if s, ok := d.eng.Records.Snapshots.Get(id); ok {
			out.Snapshots = append(out.Snapshots, d.csiSnapshot(s))
		}
	}
	return out
}

// CreateVolumeGroupSnapshot snapshots every source volume, or none: a
// failure half-way removes the member snapshots already made.
func (d *Driver) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (_ *csi.CreateVolumeGroupSnapshotResponse, err error) {
	defer edge(&err)
	name := req.GetName()
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	srcs := req.GetSourceVolumeIds()
	if len(srcs) == 0 {
		return nil, invalid("source_volume_ids is required")
	}
	for i, id := range srcs {
		if err := d.checkIDHere("source_volume_ids", id); err != nil {
			return nil, err
		}
		if slices.Contains(srcs[:i], id) {
			return nil, invalid("volume %s is listed twice", id)
		}
	}
	if _, _, _, err := d.eng.SnapshotOptions(req.GetParameters(), engine.LayoutDirectory, nil); err != nil {
		return nil, err
	}
	g, err := d.eng.CreateGroup(ctx, name, srcs, req.GetParameters())
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: d.csiGroup(g)}, nil
}

// GetVolumeGroupSnapshot reports a group snapshot.
func (d *Driver) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (_ *csi.GetVolumeGroupSnapshotResponse, err error) {
	defer edge(&err)
	if err := d.checkIDHere("group_snapshot_id", req.GetGroupSnapshotId()); err != nil {
		return nil, err
	}
	g, ok := d.eng.Records.Groups.Get(req.GetGroupSnapshotId())
	if !ok || g.Phase != engine.PhaseReady {
		return nil, status.Errorf(codes.NotFound, "group snapshot %q does not exist", req.GetGroupSnapshotId())
	}
	if len(req.GetSnapshotIds()) > 0 {
		if !engine.SameSet(g.Snapshots, req.GetSnapshotIds()) {
			return nil, invalid("snapshot_ids do not match the members of group snapshot %s", g.ID)
		}
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: d.csiGroup(g)}, nil
}

// DeleteVolumeGroupSnapshot removes a group snapshot and its members.
// Unknown or malformed ids are success.
func (d *Driver) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (_ *csi.DeleteVolumeGroupSnapshotResponse, err error) {
	defer edge(&err)
	id := req.GetGroupSnapshotId()
	if err := d.checkIDHere("group_snapshot_id", id); err != nil {
		return nil, err
	}
	if !engine.ValidGroupID(id) {
		return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
	}
	if err := d.eng.DeleteGroup(id, req.GetSnapshotIds()); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}
