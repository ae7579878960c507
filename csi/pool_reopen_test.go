package csi

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/hostpath-csi/hostpath/engine"
)

// TestPoolBackUnderARestore: a pool whose disk goes away and comes back
// while a restore into it runs is brought up (and reconciled: its creating
// records and tmp/ cleared) only once that restore has ended. Before, the
// reconcile removed the restore's creating record and data under it, and
// the create could record ready with no data. The restore succeeds with
// every byte of its snapshot, and the pool comes up after it.
func TestPoolBackUnderARestore(t *testing.T) {
	cfg, fast, _, _ := twoPools(t)
	cfg.PoolRetryInterval = 5 * time.Millisecond
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	src := mustCreate(t, d, "src", 512<<20).GetVolumeId()
	srcDir := volumeDir(d, src)
	for i := range 4 {
		writeSynced(t, filepath.Join(srcDir, fmt.Sprintf("f%d", i)), 32<<20)
	}
	want := treeSum(t, srcDir)
	snap, err := d.CreateSnapshot(ctx, snapReq("snap", src, nil))
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(fast, engine.PoolMarker)
	mark, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; ; round++ {
		if round == 5 {
			t.Fatal("five restores ended before the pool could be taken down under them")
		}
		type result struct {
			v   *csi.CreateVolumeResponse
			err error
		}
		done := make(chan result, 1)
		go func() {
			v, err := d.CreateVolume(ctx, withSnapshotSource(inPool(fmt.Sprintf("r%d", round), "fast", 200<<20), snap.GetSnapshot().GetSnapshotId()))
			done <- result{v, err}
		}()
		running := false
		for deadline := time.Now().Add(30 * time.Second); !running && len(done) == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			for _, b := range opSeries(t, d, "hostpath_operation_bytes_done", "restore") {
				running = running || b > 0
			}
		}
		// The disk goes and comes back: the marker is another file
		// (what a remount of a replaced disk shows), naming the pool.
		tmp := marker + ".new"
		if err := os.WriteFile(tmp, mark, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, marker); err != nil {
			t.Fatal(err)
		}
		wentDown := poolGauge(t, d, "hostpath_pool_up", "fast") == 0
		r := <-done
		if r.err != nil {
			t.Fatalf("the restore under a pool that went down and came back: %v", r.err)
		}
		id := r.v.GetVolume().GetVolumeId()
		// The pool comes up once the restore is over.
		for deadline := time.Now().Add(10 * time.Second); poolGauge(t, d, "hostpath_pool_up", "fast") != 1; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("pool fast did not come back after the restore ended")
			}
		}
		if got := treeSum(t, filepath.Join(fast, "volumes", id)); got != want {
			t.Fatal("the restored volume does not hold its snapshot's data")
		}
		if _, err := d.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("the restored volume after its pool came back: %v", err)
		}
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
		if running && wentDown {
			return
		}
		t.Logf("round %d: the restore was running %v, the pool went down under it %v; again", round, running, wentDown)
	}
}
