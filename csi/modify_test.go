package csi

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/grpc/codes"
)

func TestModifyVolume(t *testing.T) {
	cfg := testConfig(t)
	cfg.EnableModifyVolume = true
	cfg.Capacity = map[string]int64{"fast": 10 << 20, "slow": 10 << 20}
	d := newDriver(t, cfg)
	req := createReq("m", 8<<20)
	req.Parameters = map[string]string{"kind": "fast"}
	req.MutableParameters = map[string]string{"snapshotFormat": "tar.gz"}
	v, err := d.CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	id := v.GetVolume().GetVolumeId()
	// Moving to "slow" moves the reservation: fast frees up, slow fills.
	if _, err := d.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"kind": "slow", "snapshotCompression": "compact"}}); err != nil {
		t.Fatal(err)
	}
	fast, _ := d.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"kind": "fast"}})
	slow, _ := d.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"kind": "slow"}})
	if fast.GetAvailableCapacity() != 10<<20 || slow.GetAvailableCapacity() != 2<<20 {
		t.Fatalf("after the move fast has %d, slow %d", fast.GetAvailableCapacity(), slow.GetAvailableCapacity())
	}
	rec, _ := volumeRec(d, id)
	if rec.Mutable["snapshotFormat"] != "tar.gz" || rec.Mutable["snapshotCompression"] != "compact" {
		t.Fatalf("stored parameters %v", rec.Mutable)
	}
	// A second volume cannot move into the full pool.
	r2 := createReq("m2", 8<<20)
	r2.Parameters = map[string]string{"kind": "fast"}
	v2, _ := d.CreateVolume(ctx, r2)
	_, err = d.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: v2.GetVolume().GetVolumeId(), MutableParameters: map[string]string{"kind": "slow"}})
	wantCode(t, err, codes.ResourceExhausted)
	for _, bad := range []map[string]string{{"XXX": "1"}, {"kind": "none"}, {"snapshotFormat": "zip"}} {
		_, err := d.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: bad})
		wantCode(t, err, codes.InvalidArgument)
	}
	// The stored snapshot defaults are applied.
	s, err := d.CreateSnapshot(ctx, snapReq("ms", id, nil))
	if err != nil {
		t.Fatal(err)
	}
	srec, _ := snapshotRec(d, s.GetSnapshot().GetSnapshotId())
	if srec.Format != engine.FormatTarGz {
		t.Fatalf("snapshot format %q, want the volume's tar.gz", srec.Format)
	}
}
