package csi

import (
	"bytes"
	"errors"
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
	"github.com/hostpath-csi/hostpath/loop"
)

// poolDir is a pool's directory on a fresh file system of fstype, and that
// file system (testfs.PoolDir).
func poolDir(t *testing.T, fstype string) (dir, disk string) {
	t.Helper()
	return testfs.PoolDir(t, run, fstype)
}

// twoPools configures a driver with pool fast (ext4, not reflink; disk is
// its file system) and pool big (XFS, reflink) beside the state dir.
func twoPools(t *testing.T) (cfg engine.Config, fast, disk, big string) {
	t.Helper()
	testutil.RequireRoot(t)
	fast, disk = poolDir(t, "ext4")
	big, _ = poolDir(t, "xfs")
	cfg = testConfig(t)
	cfg.Pools = map[string]string{"fast": fast, "big": big}
	return cfg, fast, disk, big
}

func inPool(name, pool string, size int64) *csi.CreateVolumeRequest {
	r := createReq(name, size)
	if pool != "" {
		r.Parameters = map[string]string{engine.ParamPool: pool}
	}
	return r
}

func poolCapacity(t *testing.T, d *Driver, pool string) int64 {
	t.Helper()
	r, err := d.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{engine.ParamPool: pool}})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetAvailableCapacity()
}

// TestPools: volumes and snapshots go to the pool their class names, on
// that pool's file system; capacity is each pool's own; restores and
// clones cross pools by copying; an unknown pool is InvalidArgument
// naming the node's pools; everything is there after a restart.
func TestPools(t *testing.T) {
	cfg, fast, _, big := twoPools(t)
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })

	_, err := d.CreateVolume(ctx, inPool("nowhere", "slow", 1<<20))
	wantCode(t, err, codes.InvalidArgument)
	if !strings.Contains(err.Error(), "default, big, fast") {
		t.Fatalf("%v: want the node's pools named", err)
	}

	fastBefore, bigBefore := poolCapacity(t, d, "fast"), poolCapacity(t, d, "big")
	var st unix.Statfs_t
	unix.Statfs(fast, &st)
	if real := int64(st.Bavail) * st.Bsize; fastBefore != real {
		t.Fatalf("pool fast's capacity %d, its file system has %d free", fastBefore, real)
	}
	v := mustCreateReq(t, d, inPool("in-fast", "fast", 20<<20))
	id := v.GetVolumeId()
	dir := filepath.Join(fast, "volumes", id)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("volume in pool fast has no directory in it: %v", err)
	}
	if got := poolCapacity(t, d, "fast"); got > fastBefore-20<<20 {
		t.Fatalf("pool fast's capacity %d after a 20 MiB volume, was %d", got, fastBefore)
	}
	if got := poolCapacity(t, d, "big"); got < bigBefore-1<<20 {
		t.Fatalf("pool big's capacity fell from %d to %d for a volume in fast", bigBefore, got)
	}
	writeSynced(t, filepath.Join(dir, "data"), 3<<20)
	sum := treeSum(t, dir)

	blk, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "blk-big", Parameters: map[string]string{engine.ParamPool: "big"},
		VolumeCapabilities: []*csi.VolumeCapability{blockCap()}, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	blkID := blk.GetVolume().GetVolumeId()
	blkFile := filepath.Join(big, "volumes", blkID+engine.BlockSuffix)
	if _, err := os.Stat(blkFile); err != nil {
		t.Fatalf("block volume in pool big: %v", err)
	}
	// Its snapshot (an image, in pool big) restored into pool fast.
	blkData := writeSynced(t, blkFile+".data", 1<<20)
	os.Remove(blkFile + ".data")
	dev, ok, _ := loop.Find(blkFile)
	if !ok {
		t.Fatal("block volume in pool big has no loop device")
	}
	if f, err := os.OpenFile(dev.Path(), os.O_WRONLY, 0); err != nil {
		t.Fatal(err)
	} else {
		f.WriteAt(blkData, 2<<20)
		f.Sync()
		f.Close()
	}
	bs, err := d.CreateSnapshot(ctx, snapReq("blk-snap", blkID, nil))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := snapshotRec(d, bs.GetSnapshot().GetSnapshotId()); s.Format != engine.FormatImage || s.Pool != "big" {
		t.Fatalf("block snapshot: %s in pool %q, want an image in big", s.Format, s.Pool)
	}
	br, err := d.CreateVolume(ctx, withSnapshotSource(&csi.CreateVolumeRequest{Name: "blk-restore-fast", Parameters: map[string]string{engine.ParamPool: "fast"},
		VolumeCapabilities: []*csi.VolumeCapability{blockCap()}, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20}}, bs.GetSnapshot().GetSnapshotId()))
	if err != nil {
		t.Fatal(err)
	}
	restored, err := os.ReadFile(filepath.Join(fast, "volumes", br.GetVolume().GetVolumeId()+engine.BlockSuffix))
	if err != nil || len(restored) < 3<<20 || !bytes.Equal(restored[2<<20:3<<20], blkData) {
		t.Fatalf("block restore into pool fast: %d bytes, %v", len(restored), err)
	}
	for _, id := range []string{br.GetVolume().GetVolumeId(), blkID} {
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(blkFile); !os.IsNotExist(err) {
		t.Fatalf("deleted block volume's file in pool big: %v", err)
	}

	// Snapshots go with the volume by default, or where the class says.
	for _, tc := range []struct {
		name, pool, format, wantDir string
	}{
		{"snap-with-volume", "", engine.FormatTarGz, fast},
		{"snap-to-big", "big", engine.FormatTarGz, big},
		{"snap-to-default", engine.DefaultPool, engine.FormatTarGz, stateRoot(d)},
		{"zstd-to-big", "big", engine.FormatTarZst, big},
	} {
		params := map[string]string{}
		if tc.pool != "" {
			params[engine.ParamPool] = tc.pool
		}
		if tc.format == engine.FormatTarZst {
			params[engine.ParamCompression] = "zstd"
		}
		r, err := d.CreateSnapshot(ctx, snapReq(tc.name, id, params))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		s, _ := snapshotRec(d, r.GetSnapshot().GetSnapshotId())
		if s.Format != tc.format || !strings.HasPrefix(d.eng.SnapshotDataPath(s), tc.wantDir+"/snapshots/") {
			t.Fatalf("%s: %s snapshot at %s, want %s under %s", tc.name, s.Format, d.eng.SnapshotDataPath(s), tc.format, tc.wantDir)
		}
		// Restored into another pool: a copy with the same bytes.
		rv := mustCreateReq(t, d, withSnapshotSource(inPool("restore-"+tc.name, "big", 20<<20), s.ID))
		if got := treeSum(t, filepath.Join(big, "volumes", rv.GetVolumeId())); got != sum {
			t.Fatalf("%s restored into pool big differs", tc.name)
		}
	}
	_, err = d.CreateSnapshot(ctx, snapReq("reflink-across", id, map[string]string{engine.ParamPool: "big", engine.ParamFormat: engine.FormatReflink}))
	wantCode(t, err, codes.InvalidArgument)

	// A volume of the reflink pool snapshots by reflink there.
	bv := mustCreateReq(t, d, inPool("in-big", "big", 20<<20))
	writeSynced(t, filepath.Join(big, "volumes", bv.GetVolumeId(), "data"), 1<<20)
	r, err := d.CreateSnapshot(ctx, snapReq("big-snap", bv.GetVolumeId(), nil))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := snapshotRec(d, r.GetSnapshot().GetSnapshotId()); s.Format != engine.FormatReflink || s.Pool != "big" {
		t.Fatalf("snapshot of a volume in pool big (XFS): %s in pool %q, want a reflink in big", s.Format, s.Pool)
	}

	// A clone into another pool.
	clone := inPool("clone-to-default", "", 20<<20)
	clone.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
	cv := mustCreateReq(t, d, clone)
	if got := treeSum(t, volumeDir(d, cv.GetVolumeId())); got != sum {
		t.Fatal("clone into the default pool differs")
	}
	if _, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 30 << 20}}); err != nil {
		t.Fatalf("expanding a volume in pool fast: %v", err)
	}

	d.Close()
	d2 := newDriver(t, cfg)
	t.Cleanup(func() { d2.Close() })
	if got := treeSum(t, dir); got != sum {
		t.Fatal("the volume in pool fast changed across a restart")
	}
	target := filepath.Join(t.TempDir(), "target")
	unmountAll(t, target)
	if _, err := d2.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: rwo}); err != nil {
		t.Fatalf("publishing a volume of pool fast after a restart: %v", err)
	}
	if _, err := d2.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	// A request may not reach into a pool.
	_, err = d2.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(big, "volumes", "x"), VolumeCapability: rwo})
	wantCode(t, err, codes.InvalidArgument)
}

// TestPoolQuotas: each pool limits its directory volumes as its own file
// system can (btrfs quota groups, XFS and ext4 project quotas), whatever
// the state dir's can: a pod writing past its volume's size is stopped.
// Where the kernel has no quota support for a file system (the CI host
// has none for XFS and ext4) the pool says it accounts instead, and make
// test-kernel enforces.
func TestPoolQuotas(t *testing.T) {
	testutil.RequireRoot(t)
	type fsCase struct {
		fstype, option, mountOpt string
		size                     int64
		mkfs                     []string
		setup                    [][]string
		want                     engine.QuotaMode
	}
	cases := []fsCase{
		{"btrfs", "", "", 400 << 20, nil, [][]string{{"btrfs", "quota", "enable"}}, engine.QuotaBtrfs},
		{"xfs", "CONFIG_XFS_QUOTA", "prjquota", 300 << 20, nil, nil, engine.QuotaProject},
		{"ext4", "CONFIG_QFMT_V2", "prjquota", 300 << 20, []string{"-O", "project,quota"}, nil, engine.QuotaProject},
	}
	cfg := testConfig(t)
	cfg.Pools = map[string]string{}
	for i, c := range cases {
		if c.option != "" && !testutil.KernelHas(t, c.option) {
			t.Logf("kernel lacks %s: pool %s is checked to account, not enforce; make test-kernel enforces", c.option, c.fstype)
			cases[i].mountOpt, cases[i].mkfs, cases[i].want = "", nil, engine.QuotaNone
			c = cases[i]
		}
		dir := testfs.PoolOn(t, testfs.FileSystem(t, run, c.fstype, c.size, c.mkfs, c.mountOpt, c.setup...), c.fstype)
		cfg.Pools[c.fstype] = dir
	}
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	for _, c := range cases {
		if got := poolNow(d, c.fstype).Quota; got != c.want {
			t.Fatalf("pool %s: quota mode %v, want %v", c.fstype, got, c.want)
		}
		if c.want == engine.QuotaNone {
			continue
		}
		id := mustCreateReq(t, d, inPool("q-"+c.fstype, c.fstype, 4<<20)).GetVolumeId()
		target := filepath.Join(t.TempDir(), "target")
		unmountAll(t, target)
		if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
		err := testutil.AsPod(t, func() error { return writeMiB(filepath.Join(target, "big"), 8) })
		if !errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.ENOSPC) {
			t.Fatalf("pool %s: a pod writing 8 MiB into a 4 MiB volume: %v, want EDQUOT or ENOSPC", c.fstype, err)
		}
		t.Logf("pool %s (%v): writing 8 MiB into a 4 MiB volume stopped with %v", c.fstype, c.want, err)
		if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPoolDown: a pool whose disk is missing at start is down: its
// volumes are refused with FailedPrecondition naming the path, its
// capacity is 0, nothing of it is deleted, the other pools serve, and it
// comes back without a restart when its disk does.
func TestPoolDown(t *testing.T) {
	cfg, fast, disk, _ := twoPools(t)
	cfg.PoolRetryInterval = 20 * time.Millisecond
	d := newDriver(t, cfg)
	id := mustCreateReq(t, d, inPool("in-fast", "fast", 10<<20)).GetVolumeId()
	writeSynced(t, filepath.Join(fast, "volumes", id, "data"), 1<<20)
	sum := treeSum(t, filepath.Join(fast, "volumes", id))
	snap, err := d.CreateSnapshot(ctx, snapReq("fast-snap", id, nil))
	if err != nil {
		t.Fatal(err)
	}
	other := mustCreateReq(t, d, inPool("in-big", "big", 10<<20)).GetVolumeId()
	d.Close()

	// The disk is late: the pool's directory is an empty directory of the
	// root file system.
	if err := unix.Unmount(fast, 0); err != nil {
		t.Fatal(err)
	}
	d = newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	target := filepath.Join(t.TempDir(), "target")
	unmountAll(t, target)
	publish := func(vid string) error {
		_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vid, TargetPath: target, VolumeCapability: rwo})
		if err == nil {
			_, err = d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vid, TargetPath: target})
		}
		return err
	}
	down := []struct {
		name string
		call func() error
	}{
		{"publish", func() error { return publish(id) }},
		{"create", func() error { _, err := d.CreateVolume(ctx, inPool("new-in-fast", "fast", 1<<20)); return err }},
		{"snapshot", func() error { _, err := d.CreateSnapshot(ctx, snapReq("fast-snap-2", id, nil)); return err }},
		{"restore", func() error {
			_, err := d.CreateVolume(ctx, withSnapshotSource(inPool("from-fast", "big", 10<<20), snap.GetSnapshot().GetSnapshotId()))
			return err
		}},
		{"delete", func() error { _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); return err }},
	}
	for _, tc := range down {
		err := tc.call()
		wantCode(t, err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), fast) {
			t.Fatalf("%s in a pool that is down: %v, want the path named", tc.name, err)
		}
	}
	if c := poolCapacity(t, d, "fast"); c != 0 {
		t.Fatalf("pool fast is down, yet its capacity is %d", c)
	}
	h, err := d.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || !strings.Contains(h.String(), "PoolDown") || !strings.Contains(h.String(), fast) {
		t.Fatalf("storage health with pool fast down: %v %v", h, err)
	}
	if up := poolGauge(t, d, "hostpath_pool_up", "fast"); up != 0 {
		t.Fatalf("hostpath_pool_up{pool=fast} = %v while it is down", up)
	}
	if n := poolGauge(t, d, "hostpath_pool_volumes", "fast"); n != 1 {
		t.Fatalf("hostpath_pool_volumes{pool=fast} = %v, want its 1 volume reported while down", n)
	}
	if err := publish(other); err != nil {
		t.Fatalf("pool big while fast is down: %v", err)
	}

	testfs.Bind(t, disk, fast)
	deadline := time.Now().Add(30 * time.Second)
	for publish(id) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("pool fast did not come back: %v", publish(id))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := treeSum(t, filepath.Join(fast, "volumes", id)); got != sum {
		t.Fatal("the volume of the pool that was down lost data")
	}
	if up := poolGauge(t, d, "hostpath_pool_up", "fast"); up != 1 {
		t.Fatalf("hostpath_pool_up{pool=fast} = %v once back", up)
	}
	if free := poolGauge(t, d, "hostpath_pool_free_bytes", "fast"); free <= 0 {
		t.Fatalf("hostpath_pool_free_bytes{pool=fast} = %v", free)
	}
	for _, tc := range down[:4] {
		if err := tc.call(); err != nil {
			t.Fatalf("%s once the pool is back: %v", tc.name, err)
		}
	}
}

// TestPoolRefused: pools that cannot be used are down or refused at start
// with a message saying why, and never written to.
func TestPoolRefused(t *testing.T) {
	testutil.RequireRoot(t)
	state := filepath.Join(t.TempDir(), "state")
	sameFS := filepath.Join(t.TempDir(), "same")
	os.Mkdir(sameFS, 0o755)
	for _, tc := range []struct {
		name  string
		pools map[string]string
		start string // a start error containing this, or "" for a pool down
		down  string // the pool that is down, and its reason
		why   string
	}{
		{"default is taken", map[string]string{engine.DefaultPool: "/mnt/x"}, "the state dir's own pool", "", ""},
		{"bad name", map[string]string{"Fast": "/mnt/x"}, "lower-case letters", "", ""},
		{"relative", map[string]string{"fast": "mnt/x"}, "must be absolute", "", ""},
		{"inside the state dir", map[string]string{"fast": filepath.Join(state, "p")}, "may not hold or lie inside", "", ""},
		{"overlap", map[string]string{"a": "/mnt/x", "b": "/mnt/x/y"}, "overlap", "", ""},
		{"missing", map[string]string{"fast": filepath.Join(t.TempDir(), "nothing")}, "", "fast", "no such file"},
		{"on the state dir's file system", map[string]string{"fast": sameFS}, "", "fast", "on the state dir's file system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.StateDir, cfg.Pools = state, tc.pools
			d, err := New(cfg)
			if tc.start != "" {
				if err == nil || !strings.Contains(err.Error(), tc.start) {
					d.Close()
					t.Fatalf("start: %v, want %q", err, tc.start)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			st := poolNow(d, tc.down)
			if st.Down == nil || !strings.Contains(st.Down.Error(), tc.why) {
				t.Fatalf("pool %s: %v, want down for %q", tc.down, st.Down, tc.why)
			}
			if entries, _ := os.ReadDir(sameFS); len(entries) > 0 {
				t.Fatalf("a refused pool was written to: %v", entries)
			}
			_, err = d.CreateVolume(ctx, inPool("v", tc.down, 1<<20))
			wantCode(t, err, codes.FailedPrecondition)
		})
	}
}

// poolGauge reads a per-pool gauge from the driver's registry (-1 when
// absent).
func poolGauge(t *testing.T, d *Driver, name, pool string) float64 {
	t.Helper()
	families, err := d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pool" && l.GetValue() == pool {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

func mustCreateReq(t *testing.T, d *Driver, r *csi.CreateVolumeRequest) *csi.Volume {
	t.Helper()
	v, err := d.CreateVolume(ctx, r)
	if err != nil {
		t.Fatalf("creating %s: %v", r.GetName(), err)
	}
	return v.GetVolume()
}

func withSnapshotSource(r *csi.CreateVolumeRequest, snap string) *csi.CreateVolumeRequest {
	r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}}
	return r
}
