package csi

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

func createBlock(t *testing.T, d *Driver, name string, size int64) *csi.Volume {
	t.Helper()
	testutil.RequireRoot(t) // loop devices
	r, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{blockCap()},
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: r.GetVolume().GetVolumeId()}) })
	return r.GetVolume()
}

// TestBlockVolumeOnFileSystems: on ext4 and XFS state dirs a block volume
// is a fully allocated file of the exact size behind a loop device of that
// size with direct I/O and 512-byte blocks, bound so again after a
// "reboot" (devices detached behind the driver's back), and gone without a
// trace after delete.
func TestBlockVolumeOnFileSystems(t *testing.T) {
	for _, fstype := range []string{"ext4", "xfs"} {
		t.Run(fstype, func(t *testing.T) {
			mnt := testfs.FileSystem(t, run, fstype, 300<<20, nil, "")
			cfg := testConfig(t)
			cfg.StateDir = filepath.Join(mnt, "state")
			d := newDriver(t, cfg)
			const size = 20<<20 + 512
			v := createBlock(t, d, "blk-"+fstype, size)
			path := filepath.Join(volumesDir(d), v.GetVolumeId()+".img")
			var st unix.Stat_t
			if err := unix.Stat(path, &st); err != nil {
				t.Fatal(err)
			}
			if st.Size != size || st.Blocks*512 < size {
				t.Fatalf("backing file: size %d, %d bytes allocated; want %d preallocated", st.Size, st.Blocks*512, size)
			}
			dev, ok, err := loop.Find(path)
			if err != nil || !ok {
				t.Fatalf("no loop device: %v", err)
			}
			if got, _ := loop.Size(dev.Path()); got != size {
				t.Fatalf("device size %d, want %d", got, size)
			}
			directIO(t, dev)
			// Write through the device, "reboot", read back.
			data := bytes.Repeat([]byte("block!"), 1000)
			f, err := os.OpenFile(dev.Path(), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt(data, 1<<20)
			f.Sync()
			f.Close()
			if err := loop.Detach(dev); err != nil {
				t.Fatal(err)
			}
			d2 := newDriver(t, cfg)
			dev2, ok, err := loop.Find(path)
			if err != nil || !ok {
				t.Fatalf("restart did not re-attach the block volume: %v", err)
			}
			directIO(t, dev2)
			got := make([]byte, len(data))
			f, _ = os.Open(dev2.Path())
			f.ReadAt(got, 1<<20)
			f.Close()
			if !bytes.Equal(got, data) {
				t.Fatal("data differs after re-attach")
			}
			if _, err := d2.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
				t.Fatal(err)
			}
			if devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file"); len(devs) > 0 {
				for _, bf := range devs {
					if b, _ := os.ReadFile(bf); bytes.HasPrefix(b, []byte(stateRoot(d))) {
						t.Fatalf("loop device %s still bound to %s", bf, b)
					}
				}
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Fatal("backing file left")
			}
		})
	}
}

// directIO fails the test unless dev is bound with direct I/O and
// 512-byte logical blocks, a block volume's.
func directIO(t *testing.T, dev loop.Device) {
	t.Helper()
	info, err := loop.Status(dev)
	if err != nil || info.Flags&unix.LO_FLAGS_DIRECT_IO == 0 {
		t.Fatalf("%s: loop flags %#x (%v), want direct I/O", dev.Path(), info.Flags, err)
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev.Path()), "queue/logical_block_size"))
	if err != nil || string(bytes.TrimSpace(b)) != "512" {
		t.Fatalf("%s: logical block size %q (%v), want 512", dev.Path(), b, err)
	}
}

// TestBlockSnapshotRestore: a block snapshot holds only the allocated
// extents of a sparse volume, and a restore into a larger volume keeps the
// larger size, on the file and on the device.
func TestBlockSnapshotRestore(t *testing.T) {
	d := newDriver(t, testConfig(t))
	v := createBlock(t, d, "blk-src", 64<<20)
	// A sparse source: the preallocation punched away, 1 MiB written.
	img := filepath.Join(volumesDir(d), v.GetVolumeId()+".img")
	if err := os.Truncate(img, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	dev, _, _ := loop.Find(img)
	f, _ := os.OpenFile(dev.Path(), os.O_WRONLY, 0)
	f.WriteAt(bytes.Repeat([]byte{7}, 1<<20), 8<<20)
	f.Sync()
	f.Close()
	snap, err := d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "blk-snap", SourceVolumeId: v.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
	})
	// It reports the device size a restore needs, and holds on disk only
	// the extents that hold data.
	if s := snap.GetSnapshot().GetSizeBytes(); s != 64<<20 {
		t.Fatalf("snapshot reports %d bytes, want the volume's %d", s, 64<<20)
	}
	srec, _ := snapshotRec(d, snap.GetSnapshot().GetSnapshotId())
	var st unix.Stat_t
	if err := unix.Stat(d.eng.SnapshotDataPath(srec), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 64<<20 || st.Blocks*512 > 2<<20 {
		t.Fatalf("snapshot file: size %d, %d bytes allocated; want 64 MiB holding about 1 MiB", st.Size, st.Blocks*512)
	}
	r, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "blk-restore", VolumeCapabilities: []*csi.VolumeCapability{blockCap()},
		CapacityRange:       &csi.CapacityRange{RequiredBytes: 96 << 20},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}})
	if err != nil {
		t.Fatal(err)
	}
	rv := r.GetVolume()
	t.Cleanup(func() { d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: rv.GetVolumeId()}) })
	rdev, ok, _ := loop.Find(filepath.Join(volumesDir(d), rv.GetVolumeId()+".img"))
	if !ok {
		t.Fatal("restored volume has no device")
	}
	if size, _ := loop.Size(rdev.Path()); size != 96<<20 {
		t.Fatalf("restored device has %d bytes, want %d", size, 96<<20)
	}
	got := make([]byte, 1<<20)
	f, _ = os.Open(rdev.Path())
	f.ReadAt(got, 8<<20)
	f.Close()
	if !bytes.Equal(got, bytes.Repeat([]byte{7}, 1<<20)) {
		t.Fatal("restored data differs")
	}
}
