package csi

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// imageParams asks for the image layout.
var imageParams = map[string]string{engine.ParamLayout: engine.LayoutImage}

// createImage makes an image volume (from source, if not nil) and deletes
// it when the test ends; what a failing test leaves mounted or attached
// goes with it.
func createImage(t *testing.T, d *Driver, name string, size int64, source *csi.VolumeContentSource) *csi.Volume {
	t.Helper()
	testutil.RequireRoot(t) // loop devices, mounts
	r := createReq(name, size)
	r.Parameters, r.VolumeContentSource = imageParams, source
	v, err := d.CreateVolume(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	id := v.GetVolume().GetVolumeId()
	file := filepath.Join(volumesDir(d), id+engine.BlockSuffix)
	t.Cleanup(func() {
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("deleting image volume %s: %v", id, err)
			engine.DetachAll(file)
		}
	})
	return v.GetVolume()
}

// stageAndPublish stages an image volume and publishes it at a target,
// undone (unpublish, then unstage) when the test ends.
func stageAndPublish(t *testing.T, d *Driver, id string) (staging, target string) {
	t.Helper()
	base := t.TempDir()
	staging, target = filepath.Join(base, "staging"), filepath.Join(base, "target")
	unmountAll(t, staging, target)
	if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Errorf("unstaging %s: %v", id, err)
		}
	})
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Errorf("unpublishing %s: %v", id, err)
		}
	})
	return staging, target
}

func stateFormat(t *testing.T, d *Driver) string {
	t.Helper()
	b, err := os.ReadFile(d.eng.Paths.FormatFile())
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestImageVolume: on ext4 and XFS pools an image volume is a sparse
// file holding an ext4 of its own on a loop device; staged, its file
// system is mounted at the staging path and each publication binds it;
// what a pod writes survives a snapshot, a restore and a clone, each an
// image volume again; its stats are its own file system's. Publishing
// without staging, restoring it as a directory volume and snapshot
// formats that do not apply are refused. The state format says images
// while one exists, and goes back once none is left.
func TestImageVolume(t *testing.T) {
	for _, fstype := range []string{"ext4", "xfs"} {
		t.Run(fstype, func(t *testing.T) {
			mnt := testfs.FileSystem(t, run, fstype, 1<<30, nil, "")
			cfg := testConfig(t)
			cfg.StateDir = filepath.Join(mnt, "state")
			d := newDriver(t, cfg)
			if got := stateFormat(t, d); got != "hostpath-csi state format 2" {
				t.Fatalf("state format with no image volume: %q", got)
			}
			const size = 64 << 20
			v := createImage(t, d, "img", size, nil)
			id := v.GetVolumeId()
			if got := stateFormat(t, d); got != "hostpath-csi state format 3" {
				t.Fatalf("state format with an image volume: %q", got)
			}
			rec, _ := volumeRec(d, id)
			file := filepath.Join(volumesDir(d), id+engine.BlockSuffix)
			var st unix.Stat_t
			if err := unix.Stat(file, &st); err != nil || rec.Layout != engine.LayoutImage {
				t.Fatalf("image file: %v, record layout %q", err, rec.Layout)
			}
			if st.Size != size || st.Blocks*512 > 8<<20 {
				t.Fatalf("image file of %d bytes, %d allocated: want %d, sparse", st.Size, st.Blocks*512, size)
			}
			if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: filepath.Join(t.TempDir(), "t"), VolumeCapability: rwo}); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("publish before stage: %v, want FailedPrecondition", err)
			}
			staging, target := stageAndPublish(t, d, id)
			dev, ok, err := loop.Find(file)
			if err != nil || !ok {
				t.Fatalf("no loop device for %s: %v", file, err)
			}
			for _, p := range []string{staging, target} {
				mp, err := fsops.GetMountPoint(p)
				if err != nil || mp == nil || mp.FSType != "ext4" || mp.Dev != dev.Rdev {
					t.Fatalf("%s: mount %+v (%v), want the ext4 on %s", p, mp, err, dev.Path())
				}
				if !mp.HasOption("nosuid") || !mp.HasOption("nodev") {
					t.Fatalf("%s: options %v, want nosuid and nodev", p, mp.Options)
				}
			}
			if st, err := os.Stat(target); err != nil || st.Mode().Perm() != 0o777 {
				t.Fatalf("the volume's root: %v (%v), want 0777 as a directory volume's", st.Mode(), err)
			}
			data := bytes.Repeat([]byte("image volume "), 4096)
			if err := os.WriteFile(filepath.Join(target, "f"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			stats, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
			if err != nil {
				t.Fatal(err)
			}
			total := stats.GetUsage()[0].GetTotal()
			if total > size || total < size*9/10 {
				t.Fatalf("stats total %d bytes, want about the volume's %d", total, size)
			}

			for _, p := range []map[string]string{{engine.ParamFormat: engine.FormatReflink}, {engine.ParamFormat: "zip"}} {
				_, err := d.CreateSnapshot(ctx, snapReq("bad", id, p))
				wantCode(t, err, codes.InvalidArgument)
			}
			// The default class's parameters serve both layouts.
			s, err := d.CreateSnapshot(ctx, snapReq("snap", id, map[string]string{engine.ParamFormat: "auto", engine.ParamCompression: "fast"}))
			if err != nil {
				t.Fatal(err)
			}
			srec, _ := snapshotRec(d, s.GetSnapshot().GetSnapshotId())
			if srec.Format != engine.FormatImage || s.GetSnapshot().GetSizeBytes() != size {
				t.Fatalf("snapshot %+v: want an image of %d bytes", srec, size)
			}
			dir := fromSnapshot("as-directory", srec.ID, size)
			dir.Parameters = map[string]string{engine.ParamLayout: engine.LayoutDirectory}
			_, err = d.CreateVolume(ctx, dir)
			wantCode(t, err, codes.InvalidArgument)

			restored := createImage(t, d, "restored", size, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: srec.ID}}})
			clone := createImage(t, d, "clone", size, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}})
			for _, c := range []*csi.Volume{v, restored, clone} {
				dev, _, err := loop.Find(filepath.Join(volumesDir(d), c.GetVolumeId()+engine.BlockSuffix))
				if err != nil {
					t.Fatal(err)
				}
				if info, err := loop.Status(dev); err != nil || info.Flags&unix.LO_FLAGS_DIRECT_IO == 0 {
					t.Fatalf("volume %s: loop flags %#x (%v), want direct I/O", c.GetVolumeId(), info.Flags, err)
				}
				if c == v {
					continue
				}
				_, tgt := stageAndPublish(t, d, c.GetVolumeId())
				got, err := os.ReadFile(filepath.Join(tgt, "f"))
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("volume %s from %s: %d bytes (%v), want what was written", c.GetVolumeId(), id, len(got), err)
				}
			}
			if _, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: srec.ID}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestImageFormatFollowsVolumes: while an image volume exists the state
// format is 3 and a clean stop keeps the downgrade guard up; the start
// after the last one is gone records 2 and its clean stop lowers the
// guard, so the previous release can start on the state dir again.
func TestImageFormatFollowsVolumes(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	r := createReq("img", 32<<20)
	r.Parameters = imageParams
	v, err := d.CreateVolume(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	if got := stateFormat(t, d); got != "hostpath-csi state format 3" {
		t.Fatalf("format before the restart: %q", got)
	}
	guard := filepath.Join(tmpDir(d), ".write-probe")
	// A clean stop with an image record left (a deleted volume's record
	// is gone, so make one that stays) keeps the guard up.
	keep, err := d.CreateVolume(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if _, err := os.Stat(guard); err != nil {
		t.Fatalf("the downgrade guard after a clean stop with an image volume: %v, want it kept", err)
	}
	d = newDriver(t, cfg)
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: keep.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d = newDriver(t, cfg)
	if got := stateFormat(t, d); got != "hostpath-csi state format 2" {
		t.Fatalf("format after the last image volume went: %q", got)
	}
	d.Close()
	if _, err := os.Stat(guard); !os.IsNotExist(err) {
		t.Fatalf("the downgrade guard after a clean stop with no image volume: %v, want it gone", err)
	}
}

// TestImageParameters: the layout parameter takes directory or image;
// image is for mount volumes holding ext4.
func TestImageParameters(t *testing.T) {
	d := newDriver(t, testConfig(t))
	btrfs := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	btrfs.GetMount().FsType = "btrfs"
	for _, tc := range []struct {
		name   string
		params map[string]string
		cap    *csi.VolumeCapability
	}{
		{"unknown layout", map[string]string{engine.ParamLayout: "lvm"}, rwo},
		{"block image", imageParams, blockCap()},
		{"btrfs image", imageParams, btrfs},
	} {
		_, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "v", Parameters: tc.params, VolumeCapabilities: []*csi.VolumeCapability{tc.cap}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		}
	}
	if _, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "dir", Parameters: map[string]string{engine.ParamLayout: engine.LayoutDirectory}, VolumeCapabilities: []*csi.VolumeCapability{rwo}}); err != nil {
		t.Fatalf("layout=directory: %v", err)
	}
}

// TestImageExpansion: ControllerExpandVolume grows the image and its
// device (sparse: nothing allocated) and asks for node expansion;
// NodeExpandVolume grows the mounted file system online while a file on
// it stays open. The kernel lets only CAP_SYS_RESOURCE grow ext4, which
// this VM's root lacks: here NodeExpandVolume must then answer
// PermissionDenied, saying so, and leave the file system as it was (make
// test-kernel grows it).
func TestImageExpansion(t *testing.T) {
	d := newDriver(t, testConfig(t))
	const size, bigger = 64 << 20, 256 << 20
	v := createImage(t, d, "img", size, nil)
	id := v.GetVolumeId()
	staging, target := stageAndPublish(t, d, id)
	f, err := os.Create(filepath.Join(target, "open"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before, _ := fsops.Statfs(staging)
	r, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: bigger}, VolumeCapability: rwo})
	if err != nil || !r.GetNodeExpansionRequired() || r.GetCapacityBytes() != bigger {
		t.Fatalf("ControllerExpandVolume: %v %v, want %d bytes and node expansion", r, err, bigger)
	}
	file := filepath.Join(volumesDir(d), id+engine.BlockSuffix)
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil || st.Size != bigger || st.Blocks*512 > 8<<20 {
		t.Fatalf("grown image: %d bytes, %d allocated (%v); want %d, sparse", st.Size, st.Blocks*512, err, bigger)
	}
	dev, _, _ := loop.Find(file)
	if n, _ := loop.Size(dev.Path()); n != bigger {
		t.Fatalf("device size %d, want %d", n, bigger)
	}
	_, err = d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: bigger}})
	after, _ := fsops.Statfs(staging)
	if !testutil.HasCap(unix.CAP_SYS_RESOURCE) {
		if status.Code(err) != codes.PermissionDenied || after.TotalBytes != before.TotalBytes {
			t.Fatalf("without CAP_SYS_RESOURCE: %v and %d bytes (was %d), want PermissionDenied and no change", err, after.TotalBytes, before.TotalBytes)
		}
		t.Logf("no CAP_SYS_RESOURCE here: NodeExpandVolume refused (%v), the file system unchanged", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if after.TotalBytes < bigger*9/10 {
		t.Fatalf("file system of %d bytes after growing to %d", after.TotalBytes, bigger)
	}
	if _, err := f.Write([]byte("still open")); err != nil {
		t.Fatal(err)
	}
}

// TestImageFromAnotherNode: an image volume in use on node a, and its
// snapshot, fill image volumes on node b: the clone is a copy cut frozen
// on a, sent as extents; what the pod wrote is on b. A directory volume
// cannot be filled from them.
func TestImageFromAnotherNode(t *testing.T) {
	a, b, _ := newPeerPair(t, filepath.Join(testfs.FileSystem(t, run, "xfs", 1<<30, nil, ""), "state"))
	const size = 64 << 20
	src := createImage(t, a.d, "src", size, nil)
	_, target := stageAndPublish(t, a.d, src.GetVolumeId())
	data := bytes.Repeat([]byte("across nodes "), 10000)
	if err := os.WriteFile(filepath.Join(target, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := a.d.CreateSnapshot(ctx, snapReq("snap", src.GetVolumeId(), nil))
	if err != nil {
		t.Fatal(err)
	}
	snapID := s.GetSnapshot().GetSnapshotId()
	for _, c := range []struct {
		name string
		req  *csi.CreateVolumeRequest
	}{
		{"snapshot", fromSnapshot("r", snapID, size)},
		{"volume in use", fromVolume("c", src.GetVolumeId(), size)},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.req.Parameters = imageParams
			r, err := b.d.CreateVolume(ctx, c.req)
			if err != nil {
				t.Fatal(err)
			}
			id := r.GetVolume().GetVolumeId()
			t.Cleanup(func() { b.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}) })
			_, tgt := stageAndPublish(t, b.d, id)
			got, err := os.ReadFile(filepath.Join(tgt, "f"))
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("on b: %d bytes (%v), want what the pod on a wrote", len(got), err)
			}
		})
	}
	// A class naming the directory layout cannot be filled from an image;
	// one naming none takes the source's layout (TestDefaultLayout here).
	for _, req := range []*csi.CreateVolumeRequest{fromSnapshot("dir-r", snapID, size), fromVolume("dir-c", src.GetVolumeId(), size)} {
		req.Parameters = map[string]string{engine.ParamLayout: engine.LayoutDirectory}
		_, err := b.d.CreateVolume(ctx, req)
		wantCode(t, err, codes.InvalidArgument)
	}
	for _, req := range []*csi.CreateVolumeRequest{fromSnapshot("any-r", snapID, size), fromVolume("any-c", src.GetVolumeId(), size)} {
		r, err := b.d.CreateVolume(ctx, req)
		if err != nil {
			t.Fatalf("%s from an image on a, its class naming no layout: %v", req.Name, err)
		}
		id := r.GetVolume().GetVolumeId()
		t.Cleanup(func() { b.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}) })
		if rec, _ := volumeRec(b.d, id); rec.Layout != engine.LayoutImage {
			t.Fatalf("%s from an image on a, its class naming no layout: layout %q, want the source's", req.Name, rec.Layout)
		}
	}
	// A directory volume's snapshot on a fills an image volume on b.
	dir := mustCreate(t, a.d, "dir", size)
	if err := os.WriteFile(filepath.Join(volumeDir(a.d, dir.GetVolumeId()), "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := a.d.CreateSnapshot(ctx, snapReq("dirsnap", dir.GetVolumeId(), map[string]string{engine.ParamFormat: engine.FormatTarGz}))
	if err != nil {
		t.Fatal(err)
	}
	req := fromSnapshot("img-from-dir", ds.GetSnapshot().GetSnapshotId(), size)
	req.Parameters = imageParams
	r, err := b.d.CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetVolume().GetVolumeId()
	t.Cleanup(func() { b.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}) })
	_, tgt := stageAndPublish(t, b.d, id)
	if got, err := os.ReadFile(filepath.Join(tgt, "f")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("image volume on b from a directory volume's snapshot on a: %d bytes (%v)", len(got), err)
	}
}
