package csi

import (
	"context"
	"fmt"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// CreateVolume makes a directory or block volume, empty or filled from a
// snapshot or another volume. It is idempotent by name.
func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (_ *csi.CreateVolumeResponse, err error) {
	defer edge(&err)
	name := req.GetName()
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	access, err := checkCapabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	kind, pl, err := d.checkVolumeParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}
	layout, fs, err := checkLayout(req.GetParameters(), access, req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	if err := d.checkTopology(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	if len(req.GetMutableParameters()) > 0 {
		if !d.eng.Config.EnableModifyVolume {
			return nil, invalid("mutable_parameters need --enable-controller-modify-volume")
		}
		if err := d.checkMutable(req.GetMutableParameters()); err != nil {
			return nil, err
		}
	}
	srcSnap, srcVol := req.GetVolumeContentSource().GetSnapshot(), req.GetVolumeContentSource().GetVolume()
	if req.GetVolumeContentSource() != nil && srcSnap == nil && srcVol == nil {
		return nil, invalid("volume_content_source names neither a snapshot nor a volume")
	}
	spec := engine.VolumeSpec{Name: name, Access: access, Layout: layout, FSType: fs, Kind: kind, Params: req.GetParameters(), Pool: pl,
		Capacity: rangeOf(req.GetCapacityRange()), Mutable: req.GetMutableParameters()}
	// A source on another node is pulled from there when peers can be
	// reached: decided here, once; otherwise it must be on this node.
	switch {
	case srcSnap != nil:
		spec.Source = d.eng.SourceOf(engine.SourceSnapshot, srcSnap.GetSnapshotId())
		if spec.Source.Tag == "" {
			if err := d.checkIDHere("volume_content_source.snapshot.snapshot_id", spec.Source.ID); err != nil {
				return nil, err
			}
		}
	case srcVol != nil:
		spec.Source = d.eng.SourceOf(engine.SourceVolume, srcVol.GetVolumeId())
		if spec.Source.Tag == "" {
			if err := d.checkIDHere("volume_content_source.volume.volume_id", spec.Source.ID); err != nil {
				return nil, err
			}
		}
	}
	rec, err := d.eng.MakeVolume(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: d.csiVolume(rec)}, nil
}

// csiVolume is the CSI view of a record.
func (d *Driver) csiVolume(v engine.VolumeRecord) *csi.Volume {
	out := &csi.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes}
	switch {
	case v.SourceSnapshot != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.SourceSnapshot}}}
	case v.SourceVolume != "":
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.SourceVolume}}}
	}
	if d.eng.Config.EnableTopology {
		out.AccessibleTopology = []*csi.Topology{d.nodeTopology()}
		// A volume with a standby copy may be staged on the copy's node
		// too (a move, or a promotion once this node is fenced), so its
		// PV admits both; a PV's node affinity cannot change later.
		if v.Standby != "" {
			out.AccessibleTopology = append(out.AccessibleTopology, &csi.Topology{Segments: map[string]string{TopologyKey: v.Standby}})
		}
	}
	// The PV carries it to the standby's node (kubestandby).
	out.VolumeContext = engine.StandbyContext(v, d.eng.Config.NodeID)
	return out
}

// DeleteVolume removes a volume. An unknown or malformed id is success and
// touches nothing; a volume still mounted on this node is refused.
func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (_ *csi.DeleteVolumeResponse, err error) {
	defer edge(&err)
	id := req.GetVolumeId()
	if err := d.checkIDHere("volume_id", id); err != nil {
		return nil, err
	}
	if err := d.eng.DeleteVolume(id); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities only if this volume
// can really honour them.
func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (_ *csi.ValidateVolumeCapabilitiesResponse, err error) {
	defer edge(&err)
	if err := d.checkIDHere("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume_capabilities is required")
	}
	v, ok := d.eng.Records.Volumes.Get(req.GetVolumeId())
	if !ok || v.Phase != engine.PhaseReady {
		return nil, d.eng.NotFoundVolume(req.GetVolumeId())
	}
	if _, _, err := d.checkVolumeParameters(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	access, err := checkCapabilities(req.GetVolumeCapabilities())
	if err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	if access != v.AccessType {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("volume %s is a %s volume, not %s", v.ID, v.AccessType, access)}, nil
	}
	if v.Layout == engine.LayoutImage {
		if err := d.checkHoldsFS(v, req.GetVolumeCapabilities()...); err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes pages through the ready volumes in id order. The token is
// the last id of the previous page, so it stays valid when volumes before
// it are deleted; anything else is answered with Aborted.
func (d *Driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (_ *csi.ListVolumesResponse, err error) {
	defer edge(&err)
	all := d.eng.Records.Volumes.All()
	ready := all[:0]
	for _, v := range all {
		// Inline and local volumes belong to the node, not the CO's list.
		if v.Phase == engine.PhaseReady && !engine.NodeCreated(v) {
			ready = append(ready, v)
		}
	}
	page, next, err := paginate(ready, req.GetStartingToken(), req.GetMaxEntries(), engine.ValidVolumeID, func(v engine.VolumeRecord) string { return v.ID })
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range page {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
			Volume: d.csiVolume(v),
			Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: engine.AttachedNodes(v)},
		})
	}
	return resp, nil
}

// paginate cuts one page from items sorted by key.
func paginate[T any](items []T, token string, maxEntries int32, valid func(string) bool, key func(T) string) ([]T, string, error) {
	if maxEntries < 0 {
		return nil, "", invalid("max_entries must not be negative")
	}
	start := 0
	if token != "" {
		if !valid(token) {
			return nil, "", status.Errorf(codes.Aborted, "starting_token %q was not issued by this driver; list again from the start", token)
		}
		start = sort.Search(len(items), func(i int) bool { return key(items[i]) > token })
	}
	end := len(items)
	if maxEntries > 0 && start+int(maxEntries) < end {
		end = start + int(maxEntries)
	}
	next := ""
	if end < len(items) {
		next = key(items[end-1])
	}
	return items[start:end], next, nil
}

// ControllerGetVolume reports one volume and the nodes it is attached to.
func (d *Driver) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (_ *csi.ControllerGetVolumeResponse, err error) {
	defer edge(&err)
	if err := d.checkIDHere("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	v, ok := d.eng.Records.Volumes.Get(req.GetVolumeId())
	if !ok || v.Phase != engine.PhaseReady {
		return nil, d.eng.NotFoundVolume(req.GetVolumeId())
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: d.csiVolume(v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: engine.AttachedNodes(v)},
	}, nil
}

// ControllerGetCapabilities lists what the controller does, following the
// flags it was started with.
func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	types := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	}
	if d.eng.Config.ControllerExpansion() {
		types = append(types, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME)
	}
	if !d.eng.Config.DisableListSnapshots {
		types = append(types, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS)
	}
	if d.eng.Config.EnableModifyVolume {
		types = append(types, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME)
	}
	if d.eng.Config.EnableAttach {
		types = append(types,
			csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
			csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
			csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES)
	}
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, t := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// ControllerExpandVolume grows a volume. A request below the current size
// is already satisfied; a limit below it would be a shrink and is refused.
func (d *Driver) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (_ *csi.ControllerExpandVolumeResponse, err error) {
	defer edge(&err)
	if !d.eng.Config.ControllerExpansion() {
		return nil, status.Error(codes.Unimplemented, "controller expansion is disabled (--enable-volume-expansion=false or --disable-controller-expansion)")
	}
	id := req.GetVolumeId()
	if err := d.checkIDHere("volume_id", id); err != nil {
		return nil, err
	}
	if req.GetCapacityRange() == nil {
		return nil, invalid("capacity_range is required")
	}
	v, err := d.eng.ExpandVolume(ctx, id, rangeOf(req.GetCapacityRange()))
	if err != nil {
		return nil, err
	}
	// An image volume's file system grows on the node, online
	// (NodeExpandVolume), or at its next stage.
	grow := v.Layout == engine.LayoutImage && d.eng.Config.NodeExpansion()
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: grow}, nil
}
