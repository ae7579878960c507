package csi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testfs"
)

// TestPoolDiskGoesAway: a pool that is up and then loses its disk is taken
// down by the first request that needs it, without waiting for the
// watcher: a create is refused naming the path (in the first version it
// failed with a bare ENOENT, or, where the layout stood under the bare
// mount point, landed on the root disk); a delete keeps the record (it
// dropped it and removed nothing, so the data came back unowned); health
// and /metrics say down. Once the disk is back, the pool comes up and the
// delete removes the data.
func TestPoolDiskGoesAway(t *testing.T) {
	cfg, fast, disk, _ := twoPools(t)
	cfg.PoolRetryInterval = time.Hour // the requests see it go, not the watcher
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	id := mustCreateReq(t, d, inPool("in-fast", "fast", 10<<20)).GetVolumeId()
	writeSynced(t, filepath.Join(fast, "volumes", id, "data"), 1<<20)
	snap, err := d.CreateSnapshot(ctx, snapReq("fast-snap", id, nil))
	if err != nil {
		t.Fatal(err)
	}
	if up := poolGauge(t, d, "hostpath_pool_up", "fast"); up != 1 {
		t.Fatalf("hostpath_pool_up{pool=fast} = %v", up)
	}

	// The disk goes; the bare mount point even has the pool's layout.
	if err := unix.Unmount(fast, 0); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"volumes", "snapshots", "tmp"} {
		os.Mkdir(filepath.Join(fast, sub), 0o755)
	}
	t.Cleanup(func() {
		for _, sub := range []string{"volumes", "snapshots", "tmp"} {
			os.Remove(filepath.Join(fast, sub))
		}
	})
	_, err = d.CreateVolume(ctx, inPool("new-in-fast", "fast", 1<<20))
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), fast) || !strings.Contains(err.Error(), "went away") {
		t.Fatalf("create after the disk went: %v, want the pool named down", err)
	}
	_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
	wantCode(t, err, codes.FailedPrecondition)
	for _, sub := range []string{"volumes", "snapshots", "tmp"} {
		if entries, _ := os.ReadDir(filepath.Join(fast, sub)); len(entries) > 0 {
			t.Fatalf("written into the bare mount point's %s: %v", sub, entries)
		}
	}
	if v, ok := volumeRec(d, id); !ok || v.Phase != engine.PhaseReady {
		t.Fatalf("the volume's record after a refused delete: %+v %v", v, ok)
	}
	h, err := d.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || !strings.Contains(h.String(), "PoolDown") {
		t.Fatalf("health after the disk went: %v %v", h, err)
	}
	if up := poolGauge(t, d, "hostpath_pool_up", "fast"); up != 0 {
		t.Fatalf("hostpath_pool_up{pool=fast} = %v after the disk went", up)
	}

	for _, sub := range []string{"volumes", "snapshots", "tmp"} {
		os.Remove(filepath.Join(fast, sub))
	}
	testfs.Bind(t, disk, fast)
	d.eng.OpenPool(d.eng.Pools["fast"]) // what the watcher does at its next look
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("delete once the disk is back: %v", err)
	}
	if _, err := os.Stat(filepath.Join(fast, "volumes", id)); !os.IsNotExist(err) {
		t.Fatalf("the deleted volume's data: %v", err)
	}
}
