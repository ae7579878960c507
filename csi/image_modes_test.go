package csi

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/format/ext4"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// coveredBy reports whether [off, off+n) lies inside the ranges.
func coveredBy(ranges []*csi.BlockMetadata, off, n int64) bool {
	for _, r := range ranges {
		if r.GetByteOffset() <= off && off+n <= r.GetByteOffset()+r.GetSizeBytes() {
			return true
		}
	}
	return false
}

// TestImageSnapshotMetadata: SnapshotMetadata answers for image volumes'
// snapshots, checked against a full read of the two images: every 4 KiB
// block that holds data is inside an allocated range, and every block
// that differs between them is inside a changed range. On the state dir's
// file system the snapshots are copies; on XFS and btrfs they are
// reflinks, and the delta skips the blocks they share.
func TestImageSnapshotMetadata(t *testing.T) {
	for _, fstype := range []string{"", "xfs", "btrfs"} {
		name := fstype
		if name == "" {
			name = "state-dir"
		}
		t.Run(name, func(t *testing.T) {
			testutil.RequireRoot(t)
			cfg := testConfig(t)
			if fstype != "" {
				cfg.StateDir = filepath.Join(testfs.FileSystem(t, run, fstype, 1<<30, nil, ""), "state")
			}
			cfg.EnableSnapshotMetadata = true
			imageSnapshotMetadata(t, newDriver(t, cfg))
		})
	}
}

func imageSnapshotMetadata(t *testing.T, d *Driver) {
	v := createImage(t, d, "img", 64<<20, nil)
	_, target := stageAndPublish(t, d, v.GetVolumeId())
	if err := os.WriteFile(filepath.Join(target, "a"), bytes.Repeat([]byte("first "), 200000), 0o644); err != nil {
		t.Fatal(err)
	}
	s1, err := d.CreateSnapshot(ctx, snapReq("s1", v.GetVolumeId(), nil))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(target, "a"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("changed"), 500000)
	f.Close()
	if err := os.WriteFile(filepath.Join(target, "b"), bytes.Repeat([]byte("second "), 100000), 0o644); err != nil {
		t.Fatal(err)
	}
	s2, err := d.CreateSnapshot(ctx, snapReq("s2", v.GetVolumeId(), nil))
	if err != nil {
		t.Fatal(err)
	}
	id1, id2 := s1.GetSnapshot().GetSnapshotId(), s2.GetSnapshot().GetSnapshotId()
	alloc := &fakeStream[csi.GetMetadataAllocatedResponse]{}
	if err := d.GetMetadataAllocated(&csi.GetMetadataAllocatedRequest{SnapshotId: id1}, alloc); err != nil {
		t.Fatal(err)
	}
	var allocated []*csi.BlockMetadata
	for _, r := range alloc.got {
		allocated = append(allocated, r.GetBlockMetadata()...)
	}
	delta := &fakeStream[csi.GetMetadataDeltaResponse]{}
	if err := d.GetMetadataDelta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: id1, TargetSnapshotId: id2}, delta); err != nil {
		t.Fatal(err)
	}
	var changed []*csi.BlockMetadata
	for _, r := range delta.got {
		changed = append(changed, r.GetBlockMetadata()...)
	}
	r1, _ := snapshotRec(d, id1)
	r2, _ := snapshotRec(d, id2)
	img1, err := os.ReadFile(d.eng.SnapshotDataPath(r1))
	if err != nil {
		t.Fatal(err)
	}
	img2, err := os.ReadFile(d.eng.SnapshotDataPath(r2))
	if err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 4096)
	var nData, nChanged int
	for off := 0; off+4096 <= len(img1); off += 4096 {
		b1, b2 := img1[off:off+4096], img2[off:off+4096]
		if !bytes.Equal(b1, zero) {
			nData++
			if !coveredBy(allocated, int64(off), 4096) {
				t.Fatalf("block at %d holds data but is in no allocated range", off)
			}
		}
		if !bytes.Equal(b1, b2) {
			nChanged++
			if !coveredBy(changed, int64(off), 4096) {
				t.Fatalf("block at %d changed between the snapshots but is in no changed range", off)
			}
		}
	}
	if nChanged == 0 || nData == 0 {
		t.Fatalf("%d blocks with data, %d changed: the test wrote nothing the images show", nData, nChanged)
	}
	t.Logf("%d blocks with data, all in %d allocated ranges; %d changed, all in %d changed ranges", nData, len(allocated), nChanged, len(changed))
}

// TestImageBlockModeChange: an image volume's snapshot restores as a
// Block volume, whose device holds the file system (what a block data
// mover reads), and that volume's snapshot restores as an image volume
// again with the files; a block snapshot holding no ext4 does not.
func TestImageBlockModeChange(t *testing.T) {
	d := newDriver(t, testConfig(t))
	v := createImage(t, d, "img", 32<<20, nil)
	_, target := stageAndPublish(t, d, v.GetVolumeId())
	data := bytes.Repeat([]byte("mode change "), 5000)
	if err := os.WriteFile(filepath.Join(target, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), nil))
	if err != nil {
		t.Fatal(err)
	}
	blk := asBlock(fromSnapshot("as-block", s.GetSnapshot().GetSnapshotId(), 32<<20))
	r, err := d.CreateVolume(ctx, blk)
	if err != nil {
		t.Fatal(err)
	}
	bid := r.GetVolume().GetVolumeId()
	t.Cleanup(func() { d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: bid}) })
	dev, _, err := loop.Find(filepath.Join(volumesDir(d), bid+engine.BlockSuffix))
	if err != nil {
		t.Fatal(err)
	}
	df, err := os.Open(dev.Path())
	if err != nil {
		t.Fatal(err)
	}
	_, err = ext4.ReadSize(df)
	df.Close()
	if err != nil {
		t.Fatalf("the block volume restored from an image snapshot: %v, want its file system on the device", err)
	}
	bs, err := d.CreateSnapshot(ctx, snapReq("bs", bid, nil))
	if err != nil {
		t.Fatal(err)
	}
	back := createImage(t, d, "back", 32<<20, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: bs.GetSnapshot().GetSnapshotId()}}})
	_, bt := stageAndPublish(t, d, back.GetVolumeId())
	if got, err := os.ReadFile(filepath.Join(bt, "f")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("image volume from the block volume's snapshot: %d bytes (%v)", len(got), err)
	}
	raw := createBlock(t, d, "raw", 16<<20)
	rs, err := d.CreateSnapshot(ctx, snapReq("rs", raw.GetVolumeId(), nil))
	if err != nil {
		t.Fatal(err)
	}
	req := fromSnapshot("not-ext4", rs.GetSnapshot().GetSnapshotId(), 16<<20)
	req.Parameters = imageParams
	_, err = d.CreateVolume(ctx, req)
	wantCode(t, err, codes.InvalidArgument)
}

// TestImageArchiveExport: an image volume in use exports as tar.gz and
// tar.zst (format tar.gz, compression zstd), its tree as of the cut, and
// the archives restore directory volumes holding its files; nothing of
// the copy that was archived stays behind.
func TestImageArchiveExport(t *testing.T) {
	d := newDriver(t, testConfig(t))
	v := createImage(t, d, "img", 32<<20, nil)
	_, target := stageAndPublish(t, d, v.GetVolumeId())
	data := bytes.Repeat([]byte("exported "), 30000)
	if err := os.MkdirAll(filepath.Join(target, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "sub", "f"), data, 0o640); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		params map[string]string
		format string
	}{
		{"gz", map[string]string{engine.ParamFormat: engine.FormatTarGz}, engine.FormatTarGz},
		{"zst", map[string]string{engine.ParamFormat: engine.FormatTarGz, engine.ParamCompression: "zstd"}, engine.FormatTarZst},
	} {
		s, err := d.CreateSnapshot(ctx, snapReq("s-"+tc.name, v.GetVolumeId(), tc.params))
		if err != nil {
			t.Fatal(err)
		}
		rec, _ := snapshotRec(d, s.GetSnapshot().GetSnapshotId())
		if rec.Format != tc.format {
			t.Fatalf("%v: a %s snapshot, want %s", tc.params, rec.Format, tc.format)
		}
		r, err := d.CreateVolume(ctx, fromSnapshot("dir-"+tc.name, rec.ID, 32<<20))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(volumeDir(d, r.GetVolume().GetVolumeId()), "sub", "f"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("the directory volume restored from the %s export: %d bytes (%v)", tc.format, len(got), err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(tmpDir(d), v.GetVolumeId()+"*")); len(left) > 0 {
		t.Fatalf("left in tmp/: %v", left)
	}
	_, err := d.CreateSnapshot(ctx, snapReq("s-reflink", v.GetVolumeId(), map[string]string{engine.ParamFormat: engine.FormatReflink}))
	wantCode(t, err, codes.InvalidArgument)
}

// TestDirectoryIntoImage: a directory volume's snapshots (tar.gz, tar.zst,
// and a reflink where the state dir can) restore image volumes holding
// its files: the way an existing volume moves to the image layout.
func TestDirectoryIntoImage(t *testing.T) {
	d := newDriver(t, testConfig(t))
	src := mustCreate(t, d, "dir", 32<<20)
	data := bytes.Repeat([]byte("moved in "), 40000)
	if err := os.MkdirAll(filepath.Join(volumeDir(d, src.GetVolumeId()), "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(volumeDir(d, src.GetVolumeId()), "sub", "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	formats := map[string]map[string]string{
		"gz":  {engine.ParamFormat: engine.FormatTarGz},
		"zst": {engine.ParamCompression: "zstd"},
	}
	if d.defaultPool().Reflink {
		formats["reflink"] = map[string]string{engine.ParamFormat: engine.FormatReflink}
	}
	for name, params := range formats {
		s, err := d.CreateSnapshot(ctx, snapReq("s-"+name, src.GetVolumeId(), params))
		if err != nil {
			t.Fatal(err)
		}
		v := createImage(t, d, "img-"+name, 64<<20, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s.GetSnapshot().GetSnapshotId()}}})
		_, target := stageAndPublish(t, d, v.GetVolumeId())
		if got, err := os.ReadFile(filepath.Join(target, "sub", "f")); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("image volume from the %s snapshot: %d bytes (%v)", name, len(got), err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(tmpDir(d), "*.fill")); len(left) > 0 {
		t.Fatalf("left in tmp/: %v", left)
	}
}

// TestImageTempLeftovers: what a driver killed during an export leaves in
// tmp/ (a copy of an image bound to a loop device, its file system
// mounted) is let go and removed by the next start.
func TestImageTempLeftovers(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	img, mnt := filepath.Join(tmpDir(d), "vol-x.tree-1.img"), filepath.Join(tmpDir(d), "vol-x.tree-1.mnt")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(32 << 20)
	if _, err := ext4.Format(f, ext4.Options{}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	d.Close()
	dev, err := loop.Attach(img, loop.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(dev) })
	os.Mkdir(mnt, 0o700)
	unmountAll(t, mnt)
	if err := fsops.MountDevice(dev.Path(), mnt, "ext4", unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	d = newDriver(t, cfg)
	defer d.Close()
	if left, _ := filepath.Glob(filepath.Join(tmpDir(d), "vol-x*")); len(left) > 0 {
		t.Fatalf("left in tmp/ after the start: %v", left)
	}
	if mp, _ := fsops.GetMountPoint(mnt); mp != nil {
		t.Fatalf("%s still mounted", mnt)
	}
	// Bound to the image, not bound at all: another package's test may
	// have taken the freed device meanwhile.
	if bf, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev.Path()), "loop", "backing_file")); err == nil && strings.TrimSpace(string(bf)) == img {
		t.Fatalf("%s is still bound to %s", dev.Path(), img)
	}
}

// TestImageOddSize: an image volume whose size ends a block or a few past
// a whole group (a tail too short for a group of its own, which the
// formatter leaves out) stages as made: its file system is already as
// large as its device allows, so no resize is tried (which would need
// CAP_SYS_RESOURCE for nothing).
func TestImageOddSize(t *testing.T) {
	d := newDriver(t, testConfig(t))
	const group = 128 << 20 // 32768 blocks of 4 KiB
	for _, size := range []int64{4*group + 4096, 4*group + 100*4096} {
		v := createImage(t, d, "odd-"+strconv.FormatInt(size, 10), size, nil)
		staging, _ := stageAndPublish(t, d, v.GetVolumeId())
		dev, ok, err := loop.Find(filepath.Join(volumesDir(d), v.GetVolumeId()+engine.BlockSuffix))
		if err != nil || !ok {
			t.Fatalf("no loop device: %v", err)
		}
		f, err := os.Open(dev.Path())
		if err != nil {
			t.Fatal(err)
		}
		got, err := ext4.ReadSize(f)
		f.Close()
		want, _ := ext4.Blocks(size)
		if err != nil || got.Blocks != want || got.Blocks != 4*32768 {
			t.Fatalf("a %d-byte image volume staged at %s holds %d blocks (%v), want %d", size, staging, got.Blocks, err, want)
		}
	}
}

// TestImageSizes: an image volume holds a file system, which has a
// smallest and a largest size: a smaller request gets the smallest (a
// volume may be larger than required_bytes, within limit_bytes), a limit
// below it or a size above the largest is OutOfRange, not Internal.
func TestImageSizes(t *testing.T) {
	testutil.RequireRoot(t) // loop devices, mounts
	cfg := testConfig(t)
	cfg.MaxVolumeSize = 1 << 50
	d := newDriver(t, cfg)
	for _, tc := range []struct {
		name     string
		req, lim int64
		want     int64 // the volume's size; 0: OutOfRange
	}{
		{"1 MiB asked", 1 << 20, 0, ext4.MinSize},
		{"1 MiB asked, 32 MiB at most", 1 << 20, 32 << 20, ext4.MinSize},
		{"at most 8 MiB", 1 << 20, 8 << 20, 0},
		{"past the largest ext4", ext4.MaxSize + 4096, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := createReq(strings.ReplaceAll(tc.name, " ", "-"), tc.req)
			r.Parameters, r.CapacityRange.LimitBytes = imageParams, tc.lim
			v, err := d.CreateVolume(ctx, r)
			if tc.want == 0 {
				wantCode(t, err, codes.OutOfRange)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			id := v.GetVolume().GetVolumeId()
			t.Cleanup(func() { d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}) })
			if got := v.GetVolume().GetCapacityBytes(); got != tc.want {
				t.Fatalf("capacity %d, want %d", got, tc.want)
			}
			_, target := stageAndPublish(t, d, id)
			if err := os.WriteFile(filepath.Join(target, "f"), []byte("small"), 0o644); err != nil {
				t.Fatalf("writing in the volume: %v", err)
			}
		})
	}
}

// TestImageFromSmallBlocks: a block volume whose pod made a file system
// of blocks or sectors under 4 KiB (mkfs.ext4 -b 1024, mkfs.xfs -s
// size=512) snapshots and restores as an image volume that stages and
// shows the pod's files: its device takes the file system's own block
// size (before, it was ready but every stage failed).
func TestImageFromSmallBlocks(t *testing.T) {
	if !testutil.HaveTools(t, "mkfs.ext4 mkfs.xfs") {
		return
	}
	d := newDriver(t, testConfig(t))
	for _, tc := range []struct {
		fs   string
		mkfs []string
	}{
		{"ext4", []string{"mkfs.ext4", "-q", "-F", "-b", "1024"}},
		{"xfs", []string{"mkfs.xfs", "-q", "-f", "-s", "size=512", "-b", "size=4096"}},
	} {
		t.Run(tc.fs, func(t *testing.T) {
			const size = 320 << 20
			blk := createBlock(t, d, "blk-"+tc.fs, size)
			file := filepath.Join(volumesDir(d), blk.GetVolumeId()+engine.BlockSuffix)
			// What the pod does: a file system on the device, a file in it.
			dev, _, err := loop.Find(file)
			if err != nil {
				t.Fatal(err)
			}
			if err := run(tc.mkfs[0], append(tc.mkfs[1:], dev.Path())...); err != nil {
				t.Fatal(err)
			}
			mnt := t.TempDir()
			if err := unix.Mount(dev.Path(), mnt, tc.fs, 0, ""); err != nil {
				t.Fatal(err)
			}
			err = os.WriteFile(filepath.Join(mnt, "f"), []byte("small blocks"), 0o644)
			if uerr := unix.Unmount(mnt, 0); err == nil {
				err = uerr
			}
			if err != nil {
				t.Fatal(err)
			}
			s, err := d.CreateSnapshot(ctx, snapReq("s-"+tc.fs, blk.GetVolumeId(), nil))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s.GetSnapshot().GetSnapshotId()}) })
			img := createImage(t, d, "img-"+tc.fs, size, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s.GetSnapshot().GetSnapshotId()}}})
			_, target := stageAndPublish(t, d, img.GetVolumeId())
			if got, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(got) != "small blocks" {
				t.Fatalf("the restored image volume: %q, %v", got, err)
			}
		})
	}
}

// TestImageSnapshotDataSum: an image snapshot keeps a checksum of its data
// at rest; a byte of it changed on disk (bit rot, a stray write) fails a
// restore with DataLoss and is not sent to another node; put back, both
// work.
func TestImageSnapshotDataSum(t *testing.T) {
	a, b, _ := newPeerPair(t, filepath.Join(testfs.FileSystem(t, run, "ext4", 1<<30, nil, ""), "state"))
	const size = 64 << 20
	v := createImage(t, a.d, "img", size, nil)
	_, target := stageAndPublish(t, a.d, v.GetVolumeId())
	if err := os.WriteFile(filepath.Join(target, "f"), bytes.Repeat([]byte("at rest "), 100000), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := a.d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), nil))
	if err != nil {
		t.Fatal(err)
	}
	sid := s.GetSnapshot().GetSnapshotId()
	t.Cleanup(func() { a.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: sid}) })
	rec, _ := snapshotRec(a.d, sid)
	if len(rec.DataSum) != 64 {
		t.Fatalf("the image snapshot's record has no checksum at rest: %q", rec.DataSum)
	}
	// Flip one byte of the snapshot's data, in its first data range.
	path := a.d.eng.SnapshotDataPath(rec)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ranges, err := fsops.DataExtents(int(f.Fd()), 0, size)
	if err != nil || len(ranges) == 0 {
		t.Fatalf("the snapshot's data ranges: %v %v", ranges, err)
	}
	at := ranges[0].Offset + 1024
	orig := make([]byte, 1)
	if _, err := f.ReadAt(orig, at); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{orig[0] ^ 0xff}, at); err != nil {
		t.Fatal(err)
	}
	src := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sid}}}
	for _, c := range []struct {
		name string
		d    *Driver
	}{{"restore", a.d}, {"pull from another node", b.d}} {
		r := createReq("bad-"+strings.ReplaceAll(c.name, " ", "-"), size)
		r.Parameters, r.VolumeContentSource = imageParams, src
		made, err := c.d.CreateVolume(ctx, r)
		if err == nil {
			t.Cleanup(func() { c.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: made.GetVolume().GetVolumeId()}) })
			t.Fatalf("%s of a snapshot whose data changed at rest: made", c.name)
		}
		if c.d == a.d && status.Code(err) != codes.DataLoss {
			t.Fatalf("%s of a snapshot whose data changed at rest: %v, want DataLoss", c.name, err)
		}
		t.Logf("%s refused: %v", c.name, err)
	}
	if _, err := f.WriteAt(orig, at); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*Driver{a.d, b.d} {
		createImage(t, d, "good", size, src)
	}
}
