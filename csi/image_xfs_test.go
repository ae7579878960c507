package csi

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/format/xfs"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// fsCap is a single-node-writer mount capability naming file system fs.
func fsCap(fs string) *csi.VolumeCapability {
	c := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	c.GetMount().FsType = fs
	return c
}

// TestImageXFS: on ext4 and XFS pools, an image volume whose capability
// names xfs holds an XFS of its own (format/xfs, no mkfs), of at least
// xfs.MinSize; staged, it is mounted as XFS; a snapshot taken while it is
// published, a restore and a clone are XFS again and mount beside their
// source (same UUID: nouuid) with what the pod wrote; a capability naming
// ext4 for it, or an ext4 volume from its snapshot, is refused; on an XFS
// pool the pod's writes leave the image file's mtime alone; it grows
// online while a file is open (XFS's growfs needs CAP_SYS_ADMIN only).
func TestImageXFS(t *testing.T) {
	for _, pool := range []string{"ext4", "xfs"} {
		t.Run(pool, func(t *testing.T) {
			testutil.RequireRoot(t)
			// Room for what three XFS volumes of 300 MiB and a growth
			// reserve.
			mnt := testfs.FileSystem(t, run, pool, 2<<30, nil, "")
			cfg := testConfig(t)
			cfg.StateDir = filepath.Join(mnt, "state")
			d := newDriver(t, cfg)
			source := func(snap, vol string) *csi.VolumeContentSource {
				if snap != "" {
					return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}}
				}
				return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol}}}
			}
			create := func(name string, fs string, src *csi.VolumeContentSource) (*csi.Volume, error) {
				size := int64(64 << 20) // below the floor: the floor is given
				if src != nil {
					size = xfs.MinSize // a copy's source's size
				}
				r := createReq(name, size)
				r.Parameters, r.VolumeContentSource = imageParams, src
				r.VolumeCapabilities = []*csi.VolumeCapability{fsCap(fs)}
				v, err := d.CreateVolume(ctx, r)
				if err == nil {
					id := v.GetVolume().GetVolumeId()
					t.Cleanup(func() {
						if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
							t.Errorf("deleting %s: %v", id, err)
							engine.DetachAll(filepath.Join(volumesDir(d), id+engine.BlockSuffix))
						}
					})
				}
				return v.GetVolume(), err
			}
			v, err := create("x", "xfs", nil)
			if err != nil {
				t.Fatal(err)
			}
			id := v.GetVolumeId()
			if v.GetCapacityBytes() != xfs.MinSize {
				t.Fatalf("capacity %d for 64 MiB asked, want XFS's floor %d", v.GetCapacityBytes(), int64(xfs.MinSize))
			}
			staging, target := stageAndPublish(t, d, id)
			for _, p := range []string{staging, target} {
				if mp, err := fsops.GetMountPoint(p); err != nil || mp == nil || mp.FSType != "xfs" {
					t.Fatalf("%s: mount %+v (%v), want XFS", p, mp, err)
				}
			}
			if st, err := os.Stat(target); err != nil || st.Mode().Perm() != 0o777 {
				t.Fatalf("the volume's root: %v (%v), want 0777", st.Mode(), err)
			}
			img := filepath.Join(volumesDir(d), id+engine.BlockSuffix)
			var was unix.Stat_t
			if err := unix.Stat(img, &was); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // past a clock tick
			data := bytes.Repeat([]byte("xfs image volume "), 4096)
			if err := os.WriteFile(filepath.Join(target, "f"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			if f, err := os.OpenFile(filepath.Join(target, "f"), os.O_RDWR, 0); err != nil || f.Sync() != nil {
				t.Fatalf("syncing what the pod wrote: %v", err)
			} else {
				f.Close()
			}
			// On an XFS pool the loop device writes the image through a
			// descriptor that leaves its times alone (fsops.OpenUntimed).
			var is unix.Stat_t
			if err := unix.Stat(img, &is); err != nil {
				t.Fatal(err)
			}
			if moved := is.Mtim != was.Mtim; moved == (pool == "xfs") {
				t.Fatalf("on a %s pool the image's mtime went %v -> %v", pool, was.Mtim, is.Mtim)
			}
			// A capability naming another file system than it holds.
			_, err = d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: filepath.Join(t.TempDir(), "t"), VolumeCapability: fsCap("ext4")})
			wantCode(t, err, codes.InvalidArgument)
			vr, err := d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{fsCap("ext4")}})
			if err != nil || vr.GetConfirmed() != nil {
				t.Fatalf("ValidateVolumeCapabilities with ext4: %v %v, want unconfirmed", vr, err)
			}

			s, err := d.CreateSnapshot(ctx, snapReq("snap", id, nil))
			if err != nil {
				t.Fatal(err)
			}
			snap := s.GetSnapshot().GetSnapshotId()
			if srec, _ := snapshotRec(d, snap); srec.Format != engine.FormatImage {
				t.Fatalf("snapshot format %q, want an image", srec.Format)
			}
			_, err = create("as-ext4", "ext4", source(snap, ""))
			wantCode(t, err, codes.InvalidArgument)
			restored, err := create("restored", "", source(snap, ""))
			if err != nil {
				t.Fatal(err)
			}
			clone, err := create("clone", "xfs", source("", id))
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []*csi.Volume{restored, clone} {
				if rec, _ := volumeRec(d, c.GetVolumeId()); rec.FSType != engine.FSXFS {
					t.Fatalf("volume %s records file system %q, want xfs", c.GetVolumeId(), rec.FSType)
				}
				st, tgt := stageAndPublish(t, d, c.GetVolumeId())
				if mp, err := fsops.GetMountPoint(st); err != nil || mp == nil || mp.FSType != "xfs" {
					t.Fatalf("%s: mount %+v (%v), want XFS", st, mp, err)
				}
				got, err := os.ReadFile(filepath.Join(tgt, "f"))
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("volume %s: %d bytes (%v), want what was written", c.GetVolumeId(), len(got), err)
				}
			}

			// Online growth while a file is open.
			f, err := os.Create(filepath.Join(target, "open"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			before, err := fsops.Statfs(staging)
			if err != nil {
				t.Fatal(err)
			}
			const bigger = 512 << 20
			if _, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: bigger}, VolumeCapability: fsCap("xfs")}); err != nil {
				t.Fatal(err)
			}
			if _, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: bigger}}); err != nil {
				t.Fatalf("NodeExpandVolume: %v", err)
			}
			after, err := fsops.Statfs(staging)
			// statfs counts the data blocks, not the internal log.
			if grown := int64(after.TotalBytes) - int64(before.TotalBytes); err != nil || grown < (bigger-xfs.MinSize)*9/10 || after.TotalBytes > bigger {
				t.Fatalf("file system of %d bytes after growing to %d, %d before (%v)", after.TotalBytes, bigger, before.TotalBytes, err)
			}
			if _, err := f.Write([]byte("still open")); err != nil {
				t.Fatal(err)
			}
			if _, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestImageXFSFromAnotherNode: a restore or clone on node b of an XFS
// image volume on node a holds XFS, as its record says (so it stages as
// XFS), and a class asking ext4 for it is refused at CreateVolume, as a
// copy on the same node is (before, it was made and then refused at
// every stage).
func TestImageXFSFromAnotherNode(t *testing.T) {
	a, b, _ := newPeerPair(t, filepath.Join(testfs.FileSystem(t, run, "xfs", 2<<30, nil, ""), "state"))
	const size = 300 << 20
	r := createReq("src", size)
	r.Parameters, r.VolumeCapabilities = imageParams, []*csi.VolumeCapability{fsCap("xfs")}
	v, err := a.d.CreateVolume(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	src := v.GetVolume().GetVolumeId()
	t.Cleanup(func() { a.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: src}) })
	s, err := a.d.CreateSnapshot(ctx, snapReq("snap", src, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s.GetSnapshot().GetSnapshotId()})
	})
	for _, req := range []*csi.CreateVolumeRequest{fromSnapshot("r", s.GetSnapshot().GetSnapshotId(), size), fromVolume("c", src, size)} {
		req.Parameters = imageParams
		req.VolumeCapabilities = []*csi.VolumeCapability{fsCap("ext4")}
		bad, err := b.d.CreateVolume(ctx, req)
		if err == nil {
			t.Cleanup(func() { b.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: bad.GetVolume().GetVolumeId()}) })
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "holds xfs") {
			t.Fatalf("%s of an XFS image on another node, asked as ext4: %v, want InvalidArgument", req.Name, err)
		}
		req.VolumeCapabilities = []*csi.VolumeCapability{rwo}
		made, err := b.d.CreateVolume(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		id := made.GetVolume().GetVolumeId()
		t.Cleanup(func() { b.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}) })
		if rec, _ := volumeRec(b.d, id); rec.FSType != "xfs" {
			t.Fatalf("%s of an XFS image on another node: record says %q, want xfs", req.Name, rec.FSType)
		}
		staging, _ := stageAndPublish(t, b.d, id)
		st, err := fsops.Statfs(staging)
		if err != nil || st.Type != unix.XFS_SUPER_MAGIC {
			t.Fatalf("%s staged on b: file system type %#x (%v), want XFS", req.Name, st.Type, err)
		}
	}
}
