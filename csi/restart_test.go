package csi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// TestUnownedDataInHealth: what start finds under the volumes directory
// that no record owns is kept (the engine's TestReconcile) and reported by
// NodeGetStorageHealth, and the driver is ready.
func TestUnownedDataInHealth(t *testing.T) {
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(volumeDir(d, d.eng.NewVolumeID()), 0o755); err != nil {
		t.Fatal(err)
	}
	d2 := newDriver(t, cfg)
	h, err := d2.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || !strings.Contains(h.String(), "UnownedData") {
		t.Errorf("health does not report the unowned data: %v %v", h, err)
	}
	if !d2.ready.Load() {
		t.Fatal("not ready after reconcile")
	}
}

// TestDamagedRecordKeepsData is the data-loss defect seen through the
// API: ready volumes with data (directory and block), a clean stop, their
// record files emptied or mangled (what a disk can do; no crash of the
// driver does), a start. The data stays, the driver serves the rest,
// health says which records are damaged, and requests for those ids
// (delete among them) are refused with what to do.
func TestDamagedRecordKeepsData(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	dirVol := mustCreate(t, d, "pvc-dir", 1<<20)
	dataFile := filepath.Join(volumeDir(d, dirVol.GetVolumeId()), "f")
	if err := os.WriteFile(dataFile, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	req := createReq("pvc-blk", 1<<20)
	req.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
	blk, err := d.CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engine.DetachAll(filepath.Join(volumesDir(d), blk.GetVolume().GetVolumeId()+".img")) })
	img := filepath.Join(volumesDir(d), blk.GetVolume().GetVolumeId()+".img")
	if err := os.WriteFile(img, []byte("block data"), 0o600); err != nil {
		t.Fatal(err)
	}
	sound := mustCreate(t, d, "pvc-sound", 1<<20)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	rec := func(id string) string { return filepath.Join(metaDir(d), "volumes", id+".json") }
	os.WriteFile(rec(dirVol.GetVolumeId()), nil, 0o600)
	os.WriteFile(rec(blk.GetVolume().GetVolumeId()), []byte("{\x00\x00"), 0o600)

	d2 := newDriver(t, cfg)
	if b, err := os.ReadFile(dataFile); err != nil || string(b) != "data" {
		t.Fatalf("the directory volume's data: %q %v", b, err)
	}
	if b, err := os.ReadFile(img); err != nil || !strings.HasPrefix(string(b), "block data") {
		t.Fatalf("the block volume's data: %v", err)
	}
	if _, err := d2.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: sound.GetVolumeId()}); err != nil {
		t.Fatalf("the sound volume: %v", err)
	}
	for _, id := range []string{dirVol.GetVolumeId(), blk.GetVolume().GetVolumeId()} {
		_, err := d2.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		wantCode(t, err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), "damaged") || !strings.Contains(err.Error(), "restore the record") {
			t.Errorf("delete of a damaged volume says %v", err)
		}
		_, err = d2.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
		wantCode(t, err, codes.FailedPrecondition)
	}
	h, err := d2.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || !strings.Contains(h.String(), "StateRecordsDamaged") {
		t.Fatalf("health: %v %v", h, err)
	}
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("after the refused deletes: %v", err)
	}
}

func TestStateDirProblems(t *testing.T) {
	cfg := testConfig(t)
	cfg.StateDir = "/proc/no-such-dir/state"
	if _, err := New(cfg); err == nil {
		t.Fatal("unusable state dir accepted")
	}
	cfg = testConfig(t)
	cfg.NodeID = ""
	if _, err := New(cfg); err == nil {
		t.Fatal("missing node id accepted")
	}
}

// A state dir whose data is missing at start (a disk that mounts late, a
// directory restored from backup a minute later) loses nothing: the
// records stay, health says what is missing, publish and restore refuse
// with the path, and everything serves again once the data is back,
// without another restart.
func TestMissingDataComesBack(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	dir := mustCreate(t, d, "pvc-dir", 1<<20).GetVolumeId()
	if err := os.WriteFile(filepath.Join(volumeDir(d, dir), "f"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	snap, err := d.CreateSnapshot(ctx, snapReq("snap", dir, map[string]string{"format": "tar.gz"}))
	if err != nil {
		t.Fatal(err)
	}
	breq := createReq("pvc-block", 1<<20)
	breq.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
	br, err := d.CreateVolume(ctx, breq)
	if err != nil {
		t.Fatal(err)
	}
	blk := br.GetVolume().GetVolumeId()
	brec, _ := volumeRec(d, blk)
	t.Cleanup(func() { d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: blk}) })
	// The block volume's device goes with its disk.
	devs, err := d.eng.BlockDevices(brec)
	if err != nil || len(devs) != 1 {
		t.Fatalf("block devices %v %v", devs, err)
	}
	if err := loop.Detach(devs[0]); err != nil {
		t.Fatal(err)
	}

	// The data "disk" is away while the driver starts.
	away := filepath.Join(filepath.Dir(cfg.StateDir), "away")
	os.Mkdir(away, 0o700)
	moves := [][2]string{
		{volumeDir(d, dir), filepath.Join(away, "dir")},
		{d.eng.VolumeDataPath(brec), filepath.Join(away, "blk")},
		{filepath.Join(volumesDir(d), engine.VolumesMarker), filepath.Join(away, "marker")},
	}
	srec, _ := snapshotRec(d, snap.GetSnapshot().GetSnapshotId())
	moves = append(moves, [2]string{d.eng.SnapshotDataPath(srec), filepath.Join(away, "snap")})
	for _, m := range moves {
		if err := os.Rename(m[0], m[1]); err != nil {
			t.Fatal(err)
		}
	}
	d2 := newDriver(t, cfg)
	for _, id := range []string{dir, blk} {
		if _, err := d2.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("volume %s forgotten at start: %v", id, err)
		}
		h, err := d2.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
		if err != nil {
			t.Fatal(err)
		}
		if hs := h.GetVolumeHealth().GetHealthStatuses(); len(hs) != 1 || hs[0].GetReason() != "VolumeDataMissing" {
			t.Fatalf("health of %s with its data away: %v", id, hs)
		}
	}
	target := filepath.Join(t.TempDir(), "target")
	btarget := filepath.Join(t.TempDir(), "btarget")
	unmountAll(t, target, btarget)
	pub := &csi.NodePublishVolumeRequest{VolumeId: dir, TargetPath: target, VolumeCapability: rwo}
	_, err = d2.NodePublishVolume(ctx, pub)
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "is missing at "+volumeDir(d, dir)) {
		t.Fatalf("publish refusal does not name what is missing: %v", err)
	}
	bpub := &csi.NodePublishVolumeRequest{VolumeId: blk, TargetPath: btarget, VolumeCapability: blockCap()}
	_, err = d2.NodePublishVolume(ctx, bpub)
	wantCode(t, err, codes.FailedPrecondition)
	restore := createReq("pvc-restore", 1<<20)
	restore.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: srec.ID}}}
	_, err = d2.CreateVolume(ctx, restore)
	wantCode(t, err, codes.FailedPrecondition)

	// The disk arrives.
	for _, m := range moves {
		if err := os.Rename(m[1], m[0]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d2.NodePublishVolume(ctx, pub); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(b) != "data" {
		t.Fatalf("published data %q %v", b, err)
	}
	if _, err := d2.NodePublishVolume(ctx, bpub); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.CreateVolume(ctx, restore); err != nil {
		t.Fatal(err)
	}
	h, _ := d2.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: dir})
	if hs := h.GetVolumeHealth().GetHealthStatuses(); len(hs) != 0 {
		t.Fatalf("health after the data came back: %v", hs)
	}
	for _, u := range []*csi.NodeUnpublishVolumeRequest{{VolumeId: dir, TargetPath: target}, {VolumeId: blk, TargetPath: btarget}} {
		if _, err := d2.NodeUnpublishVolume(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d2.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: blk}); err != nil {
		t.Fatal(err)
	}
}

// TestFreshBlockVolumePublished: the first publish of a fresh block
// volume (its backing file not yet fsynced; the engine's
// TestFreshBlockVolumeAfterPowerLoss) makes its file durable.
func TestFreshBlockVolumePublished(t *testing.T) {
	testutil.RequireRoot(t)
	d := newDriver(t, testConfig(t))
	req := createReq("pvc-pub", 8<<20)
	req.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
	r, err := d.CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetVolume().GetVolumeId()
	t.Cleanup(func() { d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}) })
	target := filepath.Join(t.TempDir(), "dev")
	unmountAll(t, target)
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: blockCap()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}) })
	if rec, _ := volumeRec(d, id); rec.Fresh {
		t.Fatal("published, and still fresh")
	}
}
