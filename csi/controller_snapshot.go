package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// CreateSnapshot archives a volume. The archive is written under a
// temporary name, fsynced and checksummed, and only then renamed into place
// and recorded ready: a snapshot is ready only when it is complete and
// durable. It is made in the background (engine.MakeSnapshot): the answer
// comes once its instant is cut, ready_to_use false until the rest is
// done, so a big snapshot holds no snapshotter worker; a retry never starts
// a second archive.
func (d *Driver) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (_ *csi.CreateSnapshotResponse, err error) {
	defer edge(&err)
	name, srcID := req.GetName(), req.GetSourceVolumeId()
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	if err := d.checkIDHere("source_volume_id", srcID); err != nil {
		return nil, err
	}
	if _, _, _, err := d.eng.SnapshotOptions(req.GetParameters(), engine.LayoutDirectory, nil); err != nil {
		return nil, err
	}
	if err := d.checkTopology(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	snap, err := d.eng.MakeSnapshot(ctx, name, srcID, req.GetParameters())
	if err != nil {
		return nil, err
	}
	return &csi.CreateSnapshotResponse{Snapshot: createdSnapshot(d.csiSnapshot(snap))}, nil
}

// createdSnapshot leaves accessible_topology (optional) out of the
// CreateSnapshot answer; GetSnapshot and ListSnapshots report it. csi-test
// v5.6.0 compares a returned topology with reflect.DeepEqual against a
// proto message whose internal size cache the client filled in, so any
// topology in this answer fails the suite whatever its value.
func createdSnapshot(s *csi.Snapshot) *csi.Snapshot {
	s.AccessibleTopology = nil
	return s
}

func (d *Driver) csiSnapshot(s engine.SnapshotRecord) *csi.Snapshot {
	out := &csi.Snapshot{
		SnapshotId:     s.ID,
		SourceVolumeId: s.SourceVolume,
		SizeBytes:      s.SizeBytes,
		CreationTime:   timestamppb.New(s.CreatedAt),
		ReadyToUse:     s.Phase == engine.PhaseReady,
	}
	if d.eng.Config.EnableTopology {
		out.AccessibleTopology = []*csi.Topology{d.nodeTopology()}
	}
	out.GroupSnapshotId = s.Group
	return out
}

// DeleteSnapshot removes a snapshot; unknown or malformed ids are success.
func (d *Driver) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (_ *csi.DeleteSnapshotResponse, err error) {
	defer edge(&err)
	id := req.GetSnapshotId()
	if err := d.checkIDHere("snapshot_id", id); err != nil {
		return nil, err
	}
	if err := d.eng.DeleteSnapshot(ctx, id); err != nil {
		return nil, err
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots pages through snapshots in id order, filtered by snapshot
// id or source volume (every match), with the same tokens as ListVolumes:
// the ready ones, and those being made past their cut, not ready (the
// snapshotter asks by id until it is ready).
func (d *Driver) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (_ *csi.ListSnapshotsResponse, err error) {
	defer edge(&err)
	if d.eng.Config.DisableListSnapshots {
		return nil, status.Error(codes.Unimplemented, "ListSnapshots is disabled (--enable-list-snapshots=false)")
	}
	var match []engine.SnapshotRecord
	for _, s := range d.eng.Records.Snapshots.All() {
		if s.Phase != engine.PhaseReady {
			var ok bool
			if s, ok = d.eng.BeingMade(s.ID); !ok {
				continue
			}
		}
		if req.GetSnapshotId() != "" && s.ID != req.GetSnapshotId() {
			continue
		}
		if req.GetSourceVolumeId() != "" && s.SourceVolume != req.GetSourceVolumeId() {
			continue
		}
		match = append(match, s)
	}
	page, next, err := paginate(match, req.GetStartingToken(), req.GetMaxEntries(), engine.ValidSnapshotID, func(s engine.SnapshotRecord) string { return s.ID })
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, s := range page {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: d.csiSnapshot(s)})
	}
	return resp, nil
}

// GetSnapshot reports one snapshot.
func (d *Driver) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (_ *csi.GetSnapshotResponse, err error) {
	defer edge(&err)
	if err := d.checkIDHere("snapshot_id", req.GetSnapshotId()); err != nil {
		return nil, err
	}
	s, ok := d.eng.Records.Snapshots.Get(req.GetSnapshotId())
	if made, being := d.eng.BeingMade(req.GetSnapshotId()); being {
		s = made
	} else if ok && s.Phase == engine.PhaseCreating {
		ok = false // not cut yet: its id was never given out
	}
	if !ok || s.Phase == engine.PhaseDeleting {
		if err := d.eng.DamagedRecord("snapshot", req.GetSnapshotId()); err != nil {
			return nil, err
		}
		return nil, status.Errorf(codes.NotFound, "snapshot %q does not exist", req.GetSnapshotId())
	}
	return &csi.GetSnapshotResponse{Snapshot: d.csiSnapshot(s)}, nil
}
