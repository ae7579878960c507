package csi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// TestRestartKeepsVolumes restarts the driver on the same state dir.
func TestRestartKeepsVolumes(t *testing.T) {
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	v := mustCreate(t, d, "pvc-keep", 1<<20)
	if err := os.WriteFile(filepath.Join(volumeDir(d, v.GetVolumeId()), "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	d2 := newDriver(t, cfg)
	r, err := d2.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: v.GetVolumeId()})
	if err != nil || r.GetVolume().GetCapacityBytes() != 1<<20 {
		t.Fatalf("%v %v", r, err)
	}
	if b, err := os.ReadFile(filepath.Join(volumeDir(d2, v.GetVolumeId()), "f")); err != nil || string(b) != "data" {
		t.Fatalf("data lost: %q %v", b, err)
	}
	if again := mustCreate(t, d2, "pvc-keep", 1<<20); again.GetVolumeId() != v.GetVolumeId() {
		t.Fatal("name index lost across restart")
	}
}

// TestReconcile plants the states a crash can leave and checks that start
// repairs each one.
func TestReconcile(t *testing.T) {
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	keep := mustCreate(t, d, "pvc-ok", 1<<20)
	lost := mustCreate(t, d, "pvc-lost", 1<<20)
	if err := os.RemoveAll(volumeDir(d, lost.GetVolumeId())); err != nil {
		t.Fatal(err)
	}
	// A create interrupted after its record and part of its data.
	half := engine.VolumeRecord{ID: d.NewVolumeID(), Name: "pvc-half", CapacityBytes: 1 << 20, AccessType: engine.AccessMount, Phase: engine.PhaseCreating, CreatedAt: time.Now()}
	writeJSON(t, filepath.Join(metaDir(d), "volumes", half.ID+".json"), half)
	os.MkdirAll(filepath.Join(volumeDir(d, half.ID), "partial"), 0o755)
	// A delete interrupted after its record said so.
	gone := mustCreate(t, d, "pvc-deleting", 1<<20)
	rec, _ := volumeRec(d, gone.GetVolumeId())
	// The records planted by hand stand for durable state: the driver
	// stops (its journal checkpointed) before they are written.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	rec.Phase = engine.PhaseDeleting
	writeJSON(t, filepath.Join(metaDir(d), "volumes", rec.ID+".json"), rec)
	// Data without a record (no crash leaves it: kept), a temp file, a
	// snapshot that never finished.
	orphan := d.NewVolumeID()
	os.MkdirAll(volumeDir(d, orphan), 0o755)
	os.WriteFile(filepath.Join(tmpDir(d), "snap-x.partial"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(metaDir(d), "volumes", ".vol-x.json.tmp-1"), []byte("{"), 0o600)
	stranger := filepath.Join(volumesDir(d), "not-ours")
	os.WriteFile(stranger, nil, 0o600)

	d2 := newDriver(t, cfg)
	// A ready volume whose data is missing keeps its record (see
	// TestMissingDataComesBack).
	want := map[string]bool{keep.GetVolumeId(): true, lost.GetVolumeId(): true}
	got := map[string]bool{}
	for _, v := range allVolumes(d2) {
		got[v.ID] = true
	}
	if len(got) != 2 || !got[keep.GetVolumeId()] || !got[lost.GetVolumeId()] {
		t.Fatalf("after reconcile volumes are %v, want %v", got, want)
	}
	for _, p := range []string{volumeDir(d, half.ID), volumeDir(d, gone.GetVolumeId()), filepath.Join(tmpDir(d), "snap-x.partial")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived reconcile", p)
		}
	}
	for _, p := range []string{stranger, volumeDir(d, orphan)} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("reconcile removed %s, which no record owns: %v", p, err)
		}
	}
	h, err := d2.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || !strings.Contains(h.String(), "UnownedData") {
		t.Errorf("health does not report the unowned data: %v %v", h, err)
	}
	if !d2.ready.Load() {
		t.Fatal("not ready after reconcile")
	}
}

// TestOrphanBlockFiles: an empty block volume's file made and attached
// beside its record's commit, and a crash before the commit: start lets
// its loop device go and removes it, since it holds no written data. A
// block file without a record that holds data is kept and reported, also
// when the data is still in the cache of a loop device bound to it.
func TestOrphanBlockFiles(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	bound := filepath.Join(volumesDir(d), d.NewVolumeID()+".img")
	if err := fsops.CreateBackingFile(bound, 1<<20); err != nil {
		t.Fatal(err)
	}
	dev, err := loop.Attach(bound, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(dev) })
	written := filepath.Join(volumesDir(d), d.NewVolumeID()+".img")
	if err := fsops.CreateBackingFile(written, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(written, make([]byte, 4096), 0o600); err != nil { // zeros, but written
		t.Fatal(err)
	}
	// Written through a loop device that a writer still holds open: the
	// write is in the device's cache, not yet in the file, whose extents
	// say it is empty until the device is flushed.
	held := filepath.Join(volumesDir(d), d.NewVolumeID()+".img")
	if err := fsops.CreateBackingFile(held, 1<<20); err != nil {
		t.Fatal(err)
	}
	heldDev, err := loop.Attach(held, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(heldDev) })
	w, err := os.OpenFile(heldDev.Path(), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteAt([]byte("a pod's write"), 0); err != nil {
		t.Fatal(err)
	}
	newDriver(t, cfg)
	if _, err := os.Stat(bound); !os.IsNotExist(err) {
		t.Errorf("%s survived reconcile", bound)
	}
	if _, err := os.Stat(held); err != nil {
		t.Errorf("a block file whose loop device held a write was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev.Path()), "loop", "backing_file")); !os.IsNotExist(err) {
		t.Errorf("the orphan's loop device %s is still bound: %v", dev.Path(), err)
	}
	if _, err := os.Stat(written); err != nil {
		t.Errorf("a block file holding written data was removed: %v", err)
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

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
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
	devs, err := d.BlockDevices(brec)
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
		{d.VolumeDataPath(brec), filepath.Join(away, "blk")},
		{filepath.Join(volumesDir(d), engine.VolumesMarker), filepath.Join(away, "marker")},
	}
	srec, _ := snapshotRec(d, snap.GetSnapshot().GetSnapshotId())
	moves = append(moves, [2]string{d.SnapshotDataPath(srec), filepath.Join(away, "snap")})
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

// TestFreshBlockVolumeAfterPowerLoss: an empty block volume's backing file
// is not fsynced at create; a power loss may take it, or its size, before
// any pod had it. Start makes it again, whole and allocated, and attaches
// it; the first publish of a fresh volume makes its file durable.
func TestFreshBlockVolumeAfterPowerLoss(t *testing.T) {
	testutil.RequireRoot(t)
	for _, loss := range []string{"file", "size", "grown"} {
		t.Run(loss, func(t *testing.T) {
			cfg := testConfig(t)
			d := newDriver(t, cfg)
			req := createReq("pvc-fresh", 8<<20)
			req.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
			r, err := d.CreateVolume(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			id := r.GetVolume().GetVolumeId()
			rec, _ := volumeRec(d, id)
			if !rec.Fresh {
				t.Fatal("a new empty block volume is not marked fresh")
			}
			devs, err := d.BlockDevices(rec)
			if err != nil || len(devs) != 1 {
				t.Fatalf("devices %v %v", devs, err)
			}
			if err := loop.Detach(devs[0]); err != nil {
				t.Fatal(err)
			}
			path := d.VolumeDataPath(rec)
			want := int64(8 << 20)
			switch loss {
			case "file":
				os.Remove(path)
			case "size":
				os.Truncate(path, 0)
			case "grown": // an expansion that a crash stopped before its record
				want = 16 << 20
				os.Truncate(path, want)
			}
			d2 := newDriver(t, cfg)
			t.Cleanup(func() { d2.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}) })
			var st unix.Stat_t
			if err := unix.Stat(path, &st); err != nil || st.Size != want || st.Blocks*512 < want {
				t.Fatalf("backing file after start: size %d, %d bytes allocated, %v", st.Size, st.Blocks*512, err)
			}
			rec, _ = volumeRec(d2, id)
			if rec.Fresh {
				t.Fatal("still fresh after start made its file durable")
			}
			if devs, err := d2.BlockDevices(rec); err != nil || len(devs) != 1 {
				t.Fatalf("devices after start %v %v", devs, err)
			}
		})
	}
	t.Run("publish", func(t *testing.T) {
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
	})
}
