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
	"github.com/hostpath-csi/hostpath/internal/testutil"
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
	bindPool(t, disk, fast)
	d.OpenPool(d.Pools["fast"]) // what the watcher does at its next look
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("delete once the disk is back: %v", err)
	}
	if _, err := os.Stat(filepath.Join(fast, "volumes", id)); !os.IsNotExist(err) {
		t.Fatalf("the deleted volume's data: %v", err)
	}
}

// statePool is a driver config whose state dir is a file system of its
// own, with pool fast on a disk of its own mounted at a directory of the
// test's (another file system): the case where an empty mount point is
// not on the state dir's file system, so only the memory of marked pools
// keeps the driver from marking it.
func statePool(t *testing.T) (cfg engine.Config, fast, disk string) {
	t.Helper()
	testutil.RequireRoot(t)
	cfg = testConfig(t)
	cfg.StateDir = filepath.Join(testfs.FileSystem(t, run, "ext4", 300<<20, nil, ""), "state")
	fast, disk = poolDir(t, "ext4")
	cfg.Pools = map[string]string{"fast": fast}
	return cfg, fast, disk
}

// TestPoolNeverMarkedTwice: the driver marks a pool by itself once; a
// later start that finds the pool's directory unmarked (its disk late, an
// empty mount point on another file system than the state dir's) keeps
// it down, even when no record names the pool any more (the first
// version marked it, and the pool's volumes would have landed on the
// root disk). hostpathplugin --mark-pool marks a new disk, and a running
// driver brings it up.
func TestPoolNeverMarkedTwice(t *testing.T) {
	cfg, fast, _ := statePool(t)
	cfg.PoolRetryInterval = 20 * time.Millisecond
	d := newDriver(t, cfg)
	id := mustCreateReq(t, d, inPool("v", "fast", 1<<20)).GetVolumeId()
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if err := unix.Unmount(fast, 0); err != nil {
		t.Fatal(err)
	}
	d = newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	if st := poolNow(d, "fast"); st.Down == nil || !strings.Contains(st.Down.Error(), "--mark-pool=fast") {
		t.Fatalf("pool fast on an empty mount point: %v, want down saying how to mark a new disk", st.Down)
	}
	if _, err := os.Stat(filepath.Join(fast, engine.PoolMarker)); !os.IsNotExist(err) {
		t.Fatalf("the empty mount point was marked: %v", err)
	}

	// A new disk for the pool, marked by a person while the driver runs.
	newDisk := testfs.FileSystem(t, run, "ext4", 300<<20, nil, "")
	bindPool(t, newDisk, fast)
	msg, err := engine.MarkPool(cfg, "fast")
	if err != nil || !strings.Contains(msg, "marked as pool fast") {
		t.Fatalf("MarkPool: %q %v", msg, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for poolNow(d, "fast").Down != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the marked disk did not come up: %v", poolNow(d, "fast").Down)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mustCreateReq(t, d, inPool("on-the-new-disk", "fast", 1<<20))
}

// TestPoolNotMarkedBesideDamage: a pool the state dir does not remember
// (marked by a release that kept no memory of its pools) whose directory
// is unmarked is not marked while any record is damaged: that record may
// be the pool's (the first version counted such a pool as empty).
func TestPoolNotMarkedBesideDamage(t *testing.T) {
	cfg, fast, _ := statePool(t)
	d := newDriver(t, cfg)
	id := mustCreateReq(t, d, inPool("v", "fast", 1<<20)).GetVolumeId()
	d.Close()
	os.WriteFile(filepath.Join(metaDir(d), "volumes", id+".json"), nil, 0o600)
	os.RemoveAll(d.Paths.KnownPools())
	if err := unix.Unmount(fast, 0); err != nil {
		t.Fatal(err)
	}
	d = newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	if st := poolNow(d, "fast"); st.Down == nil || !strings.Contains(st.Down.Error(), "damaged records") {
		t.Fatalf("pool fast beside a damaged record: %v, want down", st.Down)
	}
	if _, err := os.Stat(filepath.Join(fast, engine.PoolMarker)); !os.IsNotExist(err) {
		t.Fatalf("the empty mount point was marked: %v", err)
	}
}

// TestPoolPathsResolved: pool and state dir paths are judged by what they
// name, symlinks resolved once at start: a pool given as a symlink to its
// disk comes up (the first version judged the link, on the state dir's
// file system, and kept it down); pools that overlap through a link, and
// two pools on one file system, are refused.
func TestPoolPathsResolved(t *testing.T) {
	testutil.RequireRoot(t)
	fast, disk := poolDir(t, "ext4")
	links := t.TempDir()
	link := filepath.Join(links, "fast")
	if err := os.Symlink(fast, link); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	os.MkdirAll(cfg.StateDir, 0o755)
	stateLink := filepath.Join(links, "state")
	os.Symlink(cfg.StateDir, stateLink)
	cfg.StateDir, cfg.Pools = stateLink, map[string]string{"fast": link}
	d := newDriver(t, cfg)
	if st := poolNow(d, "fast"); st.Down != nil {
		t.Fatalf("a pool given as a symlink to its disk: %v", st.Down)
	}
	if got := d.Pools["fast"].Paths.Root; got != fast {
		t.Fatalf("pool path %s, want the link resolved to %s", got, fast)
	}
	mustCreateReq(t, d, inPool("v", "fast", 1<<20))
	d.Close()

	// Overlap through a link.
	os.Mkdir(filepath.Join(fast, "sub"), 0o755)
	subLink := filepath.Join(links, "sub")
	os.Symlink(filepath.Join(fast, "sub"), subLink)
	cfg.Pools = map[string]string{"fast": link, "other": subLink}
	if d, err := New(cfg); err == nil || !strings.Contains(err.Error(), "overlap") {
		if d != nil {
			d.Close()
		}
		t.Fatalf("pools overlapping through a link: %v, want refused", err)
	}

	// Two pools on one file system: a directory of pool fast's disk,
	// bind-mounted elsewhere.
	os.Mkdir(filepath.Join(disk, "twin"), 0o755)
	second := poolOn(t, filepath.Join(disk, "twin"), "twin")
	cfg.Pools = map[string]string{"fast": link, "twin": second}
	d = newDriver(t, cfg)
	defer d.Close()
	if st := poolNow(d, "twin"); st.Down == nil || !strings.Contains(st.Down.Error(), "file system of pool fast") {
		t.Fatalf("a second pool on pool fast's file system: %v, want down", st.Down)
	}
	if poolNow(d, "fast").Down != nil {
		t.Fatal("pool fast went down beside its twin")
	}
}
