package csi

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// One rule for ids another node made, in every RPC that takes an id:
// ResourceExhausted (the work belongs on that node), never NotFound and
// never a silent success.
func TestOtherNodeIDsOneRule(t *testing.T) {
	cfg := testConfig(t)
	cfg.EnableAttach, cfg.EnableModifyVolume, cfg.EnableSnapshotMetadata = true, true, true
	d := newDriver(t, cfg)
	own := mustCreate(t, d, "pvc-own", 1<<20).GetVolumeId()
	ownSnap, err := d.CreateSnapshot(ctx, snapReq("snap-own", own, nil))
	if err != nil {
		t.Fatal(err)
	}
	other := engine.NodeTag("node-2")
	vol, snap, group := engine.NewID(engine.VolumeIDPrefix, other), engine.NewID(engine.SnapshotIDPrefix, other), engine.NewID(engine.GroupIDPrefix, other)
	target := t.TempDir() + "/target"
	fromSnap := createReq("pvc-from-snap", 1<<20)
	fromSnap.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}}
	fromVol := createReq("pvc-from-vol", 1<<20)
	fromVol.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol}}}
	cr := &csi.CapacityRange{RequiredBytes: 2 << 20}

	calls := map[string]func() error{
		"CreateVolume from snapshot": func() error { _, err := d.CreateVolume(ctx, fromSnap); return err },
		"CreateVolume from volume":   func() error { _, err := d.CreateVolume(ctx, fromVol); return err },
		"DeleteVolume":               func() error { _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol}); return err },
		"ControllerPublishVolume": func() error {
			_, err := d.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: cfg.NodeID, VolumeCapability: rwo})
			return err
		},
		"ControllerUnpublishVolume": func() error {
			_, err := d.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: cfg.NodeID})
			return err
		},
		"ValidateVolumeCapabilities": func() error {
			_, err := d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vol, VolumeCapabilities: []*csi.VolumeCapability{rwo}})
			return err
		},
		"ControllerGetVolume": func() error {
			_, err := d.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: vol})
			return err
		},
		"ControllerExpandVolume": func() error {
			_, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vol, CapacityRange: cr})
			return err
		},
		"ControllerModifyVolume": func() error {
			_, err := d.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: vol, MutableParameters: map[string]string{"snapshotFormat": "tar.gz"}})
			return err
		},
		"ControllerGetVolumeHealth": func() error {
			_, err := d.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: vol})
			return err
		},
		"CreateSnapshot": func() error { _, err := d.CreateSnapshot(ctx, snapReq("snap-x", vol, nil)); return err },
		"DeleteSnapshot": func() error {
			_, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap})
			return err
		},
		"GetSnapshot": func() error { _, err := d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snap}); return err },
		"NodeStageVolume": func() error {
			_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: target, VolumeCapability: rwo})
			return err
		},
		"NodeUnstageVolume": func() error {
			_, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol, StagingTargetPath: target})
			return err
		},
		"NodePublishVolume": func() error {
			_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol, TargetPath: target, VolumeCapability: rwo})
			return err
		},
		"NodeUnpublishVolume": func() error {
			_, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: target})
			return err
		},
		"NodeGetVolumeStats": func() error {
			_, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol, VolumePath: target})
			return err
		},
		"NodeExpandVolume": func() error {
			_, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: vol, VolumePath: target})
			return err
		},
		"NodeGetVolumeHealth": func() error {
			_, err := d.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: vol, VolumePublishPath: target})
			return err
		},
		"CreateVolumeGroupSnapshot": func() error {
			_, err := d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{own, vol}})
			return err
		},
		"GetVolumeGroupSnapshot": func() error {
			_, err := d.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: group})
			return err
		},
		"DeleteVolumeGroupSnapshot": func() error {
			_, err := d.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: group})
			return err
		},
		"GetMetadataAllocated": func() error {
			return d.GetMetadataAllocated(&csi.GetMetadataAllocatedRequest{SnapshotId: snap}, &fakeStream[csi.GetMetadataAllocatedResponse]{})
		},
		"GetMetadataDelta": func() error {
			return d.GetMetadataDelta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: ownSnap.GetSnapshot().GetSnapshotId(), TargetSnapshotId: snap}, &fakeStream[csi.GetMetadataDeltaResponse]{})
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			err := call()
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "another node") {
				t.Fatalf("got %v, want ResourceExhausted naming another node", err)
			}
		})
	}
	// Filters of the list calls are not lookups: another node's id
	// matches nothing here.
	r, err := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: snap})
	if err != nil || len(r.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots filtered by another node's id: %v, %v", r, err)
	}
	// The volume of this node is untouched by all of that.
	if _, err := d.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: own}); err != nil {
		t.Fatal(err)
	}
}
