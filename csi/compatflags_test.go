package csi

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// The reference driver's switches for expansion, as its manifests use them.
func TestExpansionSwitches(t *testing.T) {
	testutil.RequireRoot(t)
	t.Run("controller side off: the node grows the volume", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.DisableControllerExpansion, cfg.MaxVolumeSizeNode = true, 8<<20
		d := newDriver(t, cfg)
		if hasControllerCap(t, d, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME) {
			t.Fatal("EXPAND_VOLUME advertised with controller expansion off")
		}
		id := mustCreate(t, d, "pvc-grow", 1<<20).GetVolumeId()
		_, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}})
		wantCode(t, err, codes.Unimplemented)
		target := filepath.Join(t.TempDir(), "target")
		unmountAll(t, target)
		if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
		exp := &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}}
		r, err := d.NodeExpandVolume(ctx, exp)
		if err != nil || r.GetCapacityBytes() != 4<<20 {
			t.Fatalf("node expansion: %v %v", r, err)
		}
		if v, _ := volumeRec(d, id); v.CapacityBytes != 4<<20 {
			t.Fatalf("recorded size %d after node expansion", v.CapacityBytes)
		}
		exp.CapacityRange.RequiredBytes = 16 << 20 // past --max-volume-size-node
		_, err = d.NodeExpandVolume(ctx, exp)
		wantCode(t, err, codes.OutOfRange)
		if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("node side off", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.DisableNodeExpansion = true
		d := newDriver(t, cfg)
		caps, _ := d.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
		for _, c := range caps.GetCapabilities() {
			if c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_EXPAND_VOLUME {
				t.Fatal("node EXPAND_VOLUME advertised with node expansion off")
			}
		}
		_, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "x", VolumePath: "/x"})
		wantCode(t, err, codes.Unimplemented)
		if !hasControllerCap(t, d, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME) {
			t.Fatal("controller expansion lost with only the node side off")
		}
	})
}

func hasControllerCap(t *testing.T, d *Driver, want csi.ControllerServiceCapability_RPC_Type) bool {
	t.Helper()
	caps, err := d.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(caps.GetCapabilities(), func(c *csi.ControllerServiceCapability) bool { return c.GetRpc().GetType() == want })
}

func TestAcceptedMutableParameters(t *testing.T) {
	cfg := testConfig(t)
	cfg.EnableModifyVolume, cfg.AcceptedMutableParameters = true, []string{"snapshotFormat"}
	d := newDriver(t, cfg)
	id := mustCreate(t, d, "pvc-mut", 1<<20).GetVolumeId()
	if _, err := d.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"snapshotFormat": "tar.gz"}}); err != nil {
		t.Fatal(err)
	}
	_, err := d.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"snapshotCompression": "compact"}})
	wantCode(t, err, codes.InvalidArgument)
}

func TestListSnapshotsSwitch(t *testing.T) {
	cfg := testConfig(t)
	cfg.DisableListSnapshots = true
	d := newDriver(t, cfg)
	if hasControllerCap(t, d, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS) {
		t.Fatal("LIST_SNAPSHOTS advertised while off")
	}
	_, err := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	wantCode(t, err, codes.Unimplemented)
}

// FIXED_LENGTH answers cover the same bytes as VARIABLE_LENGTH ones, in
// 4 KiB blocks.
func TestSnapshotMetadataFixedLength(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	cfg.SnapshotMetadataFixedLength = true
	d := newDriver(t, cfg)
	v := createBlock(t, d, "fixed", 4<<20)
	vid := v.GetVolumeId()
	p := filepath.Join(volumesDir(d), vid+".img")
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(0) // punch the preallocation away
	f.Truncate(4 << 20)
	f.Close()
	writeDev(t, d, vid, 1<<20, make([]byte, 3*4096+1)) // zeros are still data: 4 blocks
	s, err := d.CreateSnapshot(ctx, snapReq("fixed-1", vid, nil))
	if err != nil {
		t.Fatal(err)
	}
	alloc := &fakeStream[csi.GetMetadataAllocatedResponse]{}
	if err := d.GetMetadataAllocated(&csi.GetMetadataAllocatedRequest{SnapshotId: s.GetSnapshot().GetSnapshotId()}, alloc); err != nil {
		t.Fatal(err)
	}
	var blocks []int64
	for _, m := range alloc.got {
		if m.GetBlockMetadataType() != csi.BlockMetadataType_FIXED_LENGTH {
			t.Fatalf("type %v", m.GetBlockMetadataType())
		}
		for _, b := range m.GetBlockMetadata() {
			if b.GetSizeBytes() != deltaBlock || b.GetByteOffset()%deltaBlock != 0 {
				t.Fatalf("block %v is not a fixed 4 KiB block", b)
			}
			blocks = append(blocks, b.GetByteOffset())
		}
	}
	if len(blocks) == 0 || blocks[0] > 1<<20 || blocks[len(blocks)-1] < 1<<20+3*4096 {
		t.Fatalf("blocks %v do not cover the written range", blocks)
	}
}
