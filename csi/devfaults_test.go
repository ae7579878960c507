package csi

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// TestDeviceFaults puts device-mapper's flakey target between the state
// dir's file system and its disk, as xfstests does, and breaks the disk
// under the driver: reads of a volume's blocks fail, every write fails,
// and every write is silently dropped (then the power is cut). Each
// request that meets the fault ends with an error naming the step and the
// errno, nothing acknowledged before the fault is lost, nothing half-made
// is listed, and the same request succeeds once the disk is well again
// (after the restart a failed disk needs). The host kernel here has no
// device-mapper; make test-kernel runs this in Debian's kernels.
func TestDeviceFaults(t *testing.T) {
	testutil.RequireRoot(t)
	if !testutil.KernelHas(t, "CONFIG_DM_FLAKEY") {
		if testutil.InGuest() {
			t.Fatal("the guest kernel has no dm-flakey: the kernel harness must load dm_flakey")
		}
		t.Skip("this kernel has no device-mapper flakey target (CONFIG_DM_FLAKEY); make test-kernel runs TestDeviceFaults in Debian's kernels, and TestIOErrors breaks reads and writes through FUSE here")
	}
	for _, fstype := range []string{"ext4", "xfs"} {
		t.Run(fstype, func(t *testing.T) {
			t.Run("volume blocks fail reads", func(t *testing.T) { volumeReadErrors(t, fstype) })
			t.Run("every write fails", func(t *testing.T) { stateWriteErrors(t, fstype) })
			t.Run("writes dropped then power cut", func(t *testing.T) { droppedWrites(t, fstype) })
		})
	}
}

// fsIocFiemap is FS_IOC_FIEMAP, _IOWR('f', 11, struct fiemap), which
// x/sys/unix does not define.
const fsIocFiemap = 0xc020660b

// physicalExtents asks FIEMAP (syncing first) where file's data lies on
// its disk, as byte offsets and lengths.
func physicalExtents(t *testing.T, file string) [][2]uint64 {
	t.Helper()
	fd, err := unix.Open(file, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const max, head, ext = 256, 32, 56 // struct fiemap, struct fiemap_extent
	buf := make([]byte, head+max*ext)
	binary.LittleEndian.PutUint64(buf[8:], ^uint64(0)) // fm_length
	binary.LittleEndian.PutUint32(buf[16:], 1)         // FIEMAP_FLAG_SYNC
	binary.LittleEndian.PutUint32(buf[24:], max)       // fm_extent_count
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
		t.Fatalf("FIEMAP %s: %v", file, errno)
	}
	var out [][2]uint64
	for i := range int(binary.LittleEndian.Uint32(buf[20:])) {
		e := buf[head+i*ext:]
		out = append(out, [2]uint64{binary.LittleEndian.Uint64(e[8:]), binary.LittleEndian.Uint64(e[16:])})
	}
	if len(out) == 0 {
		t.Fatalf("%s has no extents on disk", file)
	}
	// Drop its clean pages, so reads go to the disk.
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	return out
}

// writeSynced writes random data to file and fsyncs it, returning it.
func writeSynced(t *testing.T, file string, size int) []byte {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	f, err := os.Create(file)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func deviceFaultConfig(t *testing.T, f *flakeyDisk) engine.Config {
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(f.mnt, "state")
	return cfg
}

// startDriver starts a driver closed before the disk is unmounted (its
// journal and records are held open until then).
func startDriver(t *testing.T, cfg engine.Config) *Driver {
	t.Helper()
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	return d
}

// volumeReadErrors: the blocks of a directory volume's file and of a
// block volume's backing file fail every read. A snapshot in each format,
// a clone and a block snapshot fail cleanly; with the disk healthy the
// same requests succeed and give the source's bytes.
func volumeReadErrors(t *testing.T, fstype string) {
	f := newFlakeyDisk(t, fstype)
	d := startDriver(t, deviceFaultConfig(t, f))
	src := mustCreate(t, d, "pvc-src", 16<<20).GetVolumeId()
	srcDir := volumeDir(d, src)
	writeSynced(t, filepath.Join(srcDir, "big"), 8<<20)
	writeSynced(t, filepath.Join(srcDir, "small"), 3000)
	srcSum := treeSum(t, srcDir)
	other := mustCreate(t, d, "pvc-other", 1<<20).GetVolumeId()
	blk := createBlock(t, d, "blk-src", 16<<20).GetVolumeId()
	dev, ok, _ := loop.Find(filepath.Join(volumesDir(d), blk+".img"))
	if !ok {
		t.Fatal("block volume has no loop device")
	}
	if bf, err := os.OpenFile(dev.Path(), os.O_WRONLY, 0); err != nil {
		t.Fatal(err)
	} else {
		bf.WriteAt(bytes.Repeat([]byte{9}, 2<<20), 4<<20)
		bf.Sync()
		bf.Close()
	}
	big, blkFile := filepath.Join(srcDir, "big"), filepath.Join(volumesDir(d), blk+".img")

	clone := createReq("pvc-clone", 16<<20)
	clone.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src}}}
	type step struct {
		name string
		file string                 // whose blocks fail
		call func() (string, error) // the new volume or snapshot's id
	}
	steps := []step{
		{"tar.gz snapshot", big, func() (string, error) {
			r, err := d.CreateSnapshot(ctx, snapReq("snap-gz", src, map[string]string{"format": "tar.gz"}))
			return r.GetSnapshot().GetSnapshotId(), err
		}},
		{"tar.zst snapshot", big, func() (string, error) {
			r, err := d.CreateSnapshot(ctx, snapReq("snap-zst", src, map[string]string{"compression": "zstd"}))
			return r.GetSnapshot().GetSnapshotId(), err
		}},
		{"clone", big, func() (string, error) {
			r, err := d.CreateVolume(ctx, clone)
			return r.GetVolume().GetVolumeId(), err
		}},
		{"block snapshot", blkFile, func() (string, error) {
			r, err := d.CreateSnapshot(ctx, snapReq("snap-blk", blk, nil))
			return r.GetSnapshot().GetSnapshotId(), err
		}},
	}
	for _, s := range steps {
		if (s.name == "clone" || s.name == "block snapshot") && d.defaultPool().Reflink {
			// A reflink shares the blocks and reads none of them.
			if _, err := s.call(); err != nil {
				t.Fatalf("%s by reflink: %v", s.name, err)
			}
			t.Logf("%s: the file system reflinks, so it reads no data and the fault is not met", s.name)
			continue
		}
		failsCleanly(t, d, s.name+" of a volume whose blocks fail reads", other,
			// physicalExtents also drops the file's cached pages, which
			// the previous step's successful read left.
			func() { f.set(t, f.failing(physicalExtents(t, s.file))) }, func() { f.set(t, f.healthy()) },
			func() error { _, err := s.call(); return err })
		id, err := s.call()
		if err != nil {
			t.Fatalf("%s with the disk healthy again: %v", s.name, err)
		}
		if s.name == "clone" {
			if got := treeSum(t, volumeDir(d, id)); got != srcSum {
				t.Fatal("the clone differs from its source")
			}
		} else if s.name != "block snapshot" {
			r, err := d.CreateVolume(ctx, fromSnapshot("restore-"+id, id, 16<<20))
			if err != nil {
				t.Fatal(err)
			}
			if got := treeSum(t, volumeDir(d, r.GetVolume().GetVolumeId())); got != srcSum {
				t.Fatalf("a restore of the %s differs from its source", s.name)
			}
			if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: r.GetVolume().GetVolumeId()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := treeSum(t, srcDir); got != srcSum {
		t.Fatal("the source changed")
	}
}

// ioError reports whether err is a clean error for a disk that fails
// writes: not OK, a code that says the node's storage failed, and a
// message naming the errno the file system answered (EIO, or EROFS once
// it has shut itself down).
func ioError(err error) bool {
	c := status.Code(err)
	return err != nil && (c == codes.Internal || c == codes.Unavailable || c == codes.FailedPrecondition) &&
		(strings.Contains(err.Error(), "input/output error") || strings.Contains(err.Error(), "read-only file system"))
}

// faultWorld is a driver on a flakey disk with a volume holding data and a
// snapshot of it, both made while the disk was healthy.
type faultWorld struct {
	f                 *flakeyDisk
	cfg               engine.Config
	d                 *Driver
	src, srcSum, snap string
}

func newFaultWorld(t *testing.T, fstype string, snapParams map[string]string) *faultWorld {
	w := &faultWorld{f: newFlakeyDisk(t, fstype)}
	w.cfg = deviceFaultConfig(t, w.f)
	w.d = startDriver(t, w.cfg)
	w.src = mustCreate(t, w.d, "pvc-src", 16<<20).GetVolumeId()
	writeSynced(t, filepath.Join(volumeDir(w.d, w.src), "data"), 4<<20)
	w.srcSum = treeSum(t, volumeDir(w.d, w.src))
	snap, err := w.d.CreateSnapshot(ctx, snapReq("snap", w.src, snapParams))
	if err != nil {
		t.Fatal(err)
	}
	w.snap = snap.GetSnapshot().GetSnapshotId()
	return w
}

// restart is what a failed disk or a power cut needs: the old driver
// goes, the disk is healthy and mounted again, a new driver starts on it.
// The source keeps its bytes and nothing half-made is listed.
func (w *faultWorld) restart(t *testing.T) {
	t.Helper()
	w.d.Close()
	w.f.powerCycle(t)
	w.d = startDriver(t, w.cfg)
	if got := treeSum(t, volumeDir(w.d, w.src)); got != w.srcSum {
		t.Fatal("the source volume lost data acknowledged before the disk went bad")
	}
	checkNothingHalfMade(t, w.d)
}

// restoreMatches restores the snapshot by req and compares the bytes.
func (w *faultWorld) restoreMatches(t *testing.T, req *csi.CreateVolumeRequest) {
	t.Helper()
	r, err := w.d.CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := treeSum(t, volumeDir(w.d, r.GetVolume().GetVolumeId())); got != w.srcSum {
		t.Fatal("the restore differs from its snapshot")
	}
}

// stateWriteErrors: every write to the disk fails. The requests fail
// cleanly, Probe says the driver needs the restart a failed disk needs,
// and after it (disk healthy, mounted again, driver started) everything
// acknowledged before is there with its bytes, nothing half-made is
// listed, and the same requests succeed.
func stateWriteErrors(t *testing.T, fstype string) {
	w := newFaultWorld(t, fstype, map[string]string{"compression": "zstd"})
	w.f.set(t, w.f.whole("1 error_writes"))
	restore := fromSnapshot("pvc-restore", w.snap, 64<<20)
	requests := []struct {
		name string
		call func() error
	}{
		{"restore", func() error { _, err := w.d.CreateVolume(ctx, restore); return err }},
		{"snapshot", func() error {
			_, err := w.d.CreateSnapshot(ctx, snapReq("snap-2", w.src, map[string]string{"format": "tar.gz"}))
			return err
		}},
		{"create", func() error { _, err := w.d.CreateVolume(ctx, createReq("pvc-new", 1<<20)); return err }},
	}
	for _, r := range requests {
		err := r.call()
		if !ioError(err) {
			t.Fatalf("%s on a disk that fails every write: %v, want an error naming the I/O error", r.name, err)
		}
		t.Logf("%s: %v", r.name, err)
	}
	_, perr := w.d.Probe(ctx, &csi.ProbeRequest{})
	t.Logf("Probe with the disk failing: %v", perr)

	w.restart(t)
	for _, r := range requests {
		if err := r.call(); err != nil {
			t.Fatalf("%s with the disk healthy again: %v", r.name, err)
		}
	}
	w.restoreMatches(t, restore)
}

// droppedWrites: the disk acknowledges every write and keeps none, then
// the power is cut. What was acknowledged before the disk went bad is
// there with its bytes; what was done on the lying disk is either wholly
// there or not listed at all; the same requests then succeed.
func droppedWrites(t *testing.T, fstype string) {
	w := newFaultWorld(t, fstype, map[string]string{"format": "tar.gz"})
	doomed := mustCreate(t, w.d, "pvc-doomed", 1<<20).GetVolumeId()

	w.f.set(t, w.f.whole("1 drop_writes"))
	requests := []struct {
		name string
		call func() error
	}{
		{"restore", func() error {
			_, err := w.d.CreateVolume(ctx, fromSnapshot("pvc-restore", w.snap, 16<<20))
			return err
		}},
		{"snapshot", func() error {
			_, err := w.d.CreateSnapshot(ctx, snapReq("snap-2", w.src, map[string]string{"compression": "zstd"}))
			return err
		}},
		{"delete", func() error { _, err := w.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: doomed}); return err }},
	}
	for _, r := range requests {
		if err := r.call(); err != nil {
			t.Fatalf("%s on a disk that drops writes silently: %v", r.name, err)
		}
	}
	// The power is cut: the driver is gone without a word, and what the
	// file system writes on unmount is dropped as well.
	w.restart(t)
	// Nothing done on the lying disk reached it: the deleted volume is
	// back, whole, and the restore never happened.
	if _, err := w.d.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: doomed}); err != nil {
		t.Fatalf("the volume deleted while writes were dropped: %v, want it back", err)
	}
	if n := listedVolumes(t, w.d); n != 2 {
		t.Fatalf("%d volumes listed after the power cut, want the 2 made before the disk went bad", n)
	}
	for _, r := range requests {
		if err := r.call(); err != nil {
			t.Fatalf("%s again after the power cut: %v", r.name, err)
		}
	}
	w.restoreMatches(t, fromSnapshot("pvc-restore", w.snap, 16<<20))
	checkNothingHalfMade(t, w.d)
}

func listedVolumes(t *testing.T, d *Driver) int {
	t.Helper()
	r, err := d.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return len(r.GetEntries())
}

// checkNothingHalfMade: every listed volume has its data, every volume's
// data has a listed volume, and every listed snapshot restores.
func checkNothingHalfMade(t *testing.T, d *Driver) {
	t.Helper()
	vols, err := d.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, e := range vols.GetEntries() {
		id := e.GetVolume().GetVolumeId()
		listed[id] = true
		if _, err := os.Stat(volumeDir(d, id)); err != nil {
			t.Fatalf("volume %s is listed without its data: %v", id, err)
		}
	}
	data, err := volumeData(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range data {
		if !listed[strings.TrimSuffix(e.Name(), ".img")] {
			t.Fatalf("volume data %s belongs to no listed volume", e.Name())
		}
	}
	snaps, err := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range snaps.GetEntries() {
		id := e.GetSnapshot().GetSnapshotId()
		r, err := d.CreateVolume(ctx, fromSnapshot(fmt.Sprintf("check-%d-%s", i, id), id, 16<<20))
		if err != nil {
			t.Fatalf("listed snapshot %s does not restore: %v", id, err)
		}
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: r.GetVolume().GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
}
