package csi

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// A snapshot or clone copies its source with the source's lock released:
// a pod using the volume can start and stop meanwhile (publish, unpublish,
// stats), while delete and expand of the source wait. The copy is held in
// progress by taking the only heavy-operation slot first.
func TestSourceServedDuringLongCopy(t *testing.T) {
	testutil.RequireRoot(t)
	ops := []struct {
		name  string
		start func(d *Driver, src string) error
	}{
		{"snapshot", func(d *Driver, src string) error {
			_, err := d.CreateSnapshot(ctx, snapReq("snap-long", src, nil))
			return err
		}},
		{"clone", func(d *Driver, src string) error {
			req := createReq("pvc-clone-long", 1<<20)
			req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src}}}
			_, err := d.CreateVolume(ctx, req)
			return err
		}},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.MaxHeavyOps = 1
			d := newDriver(t, cfg)
			src := mustCreate(t, d, "pvc-src", 1<<20).GetVolumeId()
			if err := os.WriteFile(filepath.Join(volumeDir(d, src), "f"), []byte("data"), 0o600); err != nil {
				t.Fatal(err)
			}
			slot, err := d.eng.Heavy.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			release := sync.OnceFunc(slot)
			done := make(chan error, 1)
			go func() { done <- op.start(d, src) }()
			t.Cleanup(func() { release(); <-done })
			waitPinned(t, d, src)

			base := t.TempDir()
			target := filepath.Join(base, "target")
			unmountAll(t, target)
			pub := &csi.NodePublishVolumeRequest{VolumeId: src, TargetPath: target, VolumeCapability: rwo}
			if _, err := d.NodePublishVolume(ctx, pub); err != nil {
				t.Fatalf("publish during a %s of the volume: %v", op.name, err)
			}
			if mountOf(t, target) == nil {
				t.Fatal("publish reported success but nothing is mounted")
			}
			if _, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: src, VolumePath: target}); err != nil {
				t.Fatalf("stats during a %s: %v", op.name, err)
			}
			if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: src, TargetPath: target}); err != nil {
				t.Fatalf("unpublish during a %s: %v", op.name, err)
			}
			_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: src})
			wantCode(t, err, codes.Aborted)
			_, err = d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: src, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}})
			wantCode(t, err, codes.Aborted)

			release()
			if err := <-done; err != nil {
				t.Fatalf("%s: %v", op.name, err)
			}
			done <- nil // for the cleanup
			if d.eng.Locks.Pinned(engine.VolIDKey(src)) {
				t.Fatal("source still pinned after the copy")
			}
			if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: src}); err != nil {
				t.Fatalf("delete after the %s: %v", op.name, err)
			}
		})
	}
}

func waitPinned(t *testing.T, d *Driver, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !d.eng.Locks.Pinned(engine.VolIDKey(id)) {
		if time.Now().After(deadline) {
			t.Fatal("the copy never started")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDeleteSnapshotWaitsForRestore(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxHeavyOps = 1
	d := newDriver(t, cfg)
	src := mustCreate(t, d, "pvc-src", 1<<20).GetVolumeId()
	r, err := d.CreateSnapshot(ctx, snapReq("snap", src, nil))
	if err != nil {
		t.Fatal(err)
	}
	sid := r.GetSnapshot().GetSnapshotId()
	release, err := d.eng.Heavy.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		req := createReq("pvc-restore", 1<<20)
		req.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sid}}}
		_, err := d.CreateVolume(ctx, req)
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !d.eng.Locks.Pinned(engine.SnapIDKey(sid)) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	_, err = d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: sid})
	if status.Code(err) != codes.Aborted {
		release()
		<-done
		t.Fatalf("delete of a snapshot being restored: %v, want Aborted", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: sid}); err != nil {
		t.Fatal(err)
	}
}
