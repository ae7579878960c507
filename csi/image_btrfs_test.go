package csi

import (
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// btrfsScrubArgs is struct btrfs_ioctl_scrub_args (linux/btrfs.h): the
// device, the range, flags, the progress (struct btrfs_scrub_progress,
// 15 counters), padded to 1024 bytes.
type btrfsScrubArgs struct {
	DevID, Start, End, Flags uint64
	Progress                 struct {
		DataExtents, TreeExtents, DataBytes, TreeBytes                uint64
		ReadErrors, CsumErrors, VerifyErrors, NoCsum, CsumDiscards    uint64
		SuperErrors, MallocErrors, Uncorrectable, Corrected, LastPhys uint64
		Unverified                                                    uint64
	}
	_ [(1024 - 32 - 15*8) / 8]uint64
}

// btrfsIocScrub is BTRFS_IOC_SCRUB, _IOWR(0x94, 27, struct btrfs_ioctl_scrub_args).
const btrfsIocScrub = 0xC400941B

// scrubBtrfs scrubs device 1 of the btrfs mounted at mnt, waiting until
// it is done (what btrfs scrub start -B does; the guests have no
// btrfs-progs), and returns its counters.
func scrubBtrfs(t *testing.T, mnt string) btrfsScrubArgs {
	t.Helper()
	f, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args := btrfsScrubArgs{DevID: 1, End: ^uint64(0)}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), btrfsIocScrub, uintptr(unsafe.Pointer(&args))); errno != 0 {
		t.Fatalf("BTRFS_IOC_SCRUB on %s: %v", mnt, errno)
	}
	return args
}

// TestImageOnBtrfsKeepsChecksums: on a btrfs pool an image volume's loop
// device is buffered (direct I/O there lets the inner file system change
// pages btrfs has checksummed, and on kernels before 6.15 those blocks
// then read as EIO), also one an earlier release bound with direct I/O,
// once staged again. Proved the way the failure shows: 1 MiB of the
// volume rewritten a page at a time by four threads while another
// fdatasyncs it (60 s in the kernel
// guests, 5 s here), the caches dropped, the whole image read back
// through btrfs, and a scrub: no EIO, no checksum error.
func TestImageOnBtrfsKeepsChecksums(t *testing.T) {
	mnt := testfs.FileSystem(t, run, "btrfs", 1<<30, nil, "")
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(mnt, "state")
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	v := createImage(t, d, "img", 128<<20, nil)
	id := v.GetVolumeId()
	image := filepath.Join(volumesDir(d), id+engine.BlockSuffix)
	staging, target := stageAndPublish(t, d, id)
	buffered := func(when string) loop.Device {
		t.Helper()
		dev, ok, err := loop.Find(image)
		if err != nil || !ok {
			t.Fatalf("%s: no loop device for the image (%v)", when, err)
		}
		info, err := loop.Status(dev)
		if err != nil {
			t.Fatal(err)
		}
		if info.Flags&unix.LO_FLAGS_DIRECT_IO != 0 {
			t.Fatalf("%s: the image's loop device on a btrfs pool has direct I/O", when)
		}
		return dev
	}
	dev := buffered("at stage")
	// What an earlier release left: the device with direct I/O.
	unstage := func() {
		t.Helper()
		if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
	}
	unstage()
	if err := loop.SetDirectIO(dev, true); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	buffered("staged again after an earlier release's direct I/O")

	run := 5 * time.Second
	if testutil.InGuest() {
		run = 60 * time.Second
	}
	f, err := os.OpenFile(filepath.Join(target, "hot"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	stop := time.Now().Add(run)
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	for w := range 4 { // rewrite 1 MiB, a page at a time at random, without pause
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := w; time.Now().Before(stop); i++ {
				rand.Read(buf)
				if _, err := f.WriteAt(buf, int64((i*97)%256)*4096); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Add(1)
	syncs := 0
	go func() { // while this one writes them back
		defer wg.Done()
		for time.Now().Before(stop) {
			if err := unix.Fdatasync(int(f.Fd())); err != nil {
				errs <- err
				return
			}
			syncs++
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	f.Close()
	unstage()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
		t.Fatal(err)
	}
	img, err := os.Open(image)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, img)
	img.Close()
	if err != nil {
		t.Fatalf("reading the image back through btrfs after %d fdatasyncs in %v: %v (after %d bytes)", syncs, run, err, n)
	}
	s := scrubBtrfs(t, mnt)
	p := s.Progress
	if p.CsumErrors+p.ReadErrors+p.VerifyErrors+p.Uncorrectable != 0 || p.DataBytes == 0 {
		t.Fatalf("scrub: %d checksum, %d read, %d verify, %d uncorrectable errors in %d data bytes", p.CsumErrors, p.ReadErrors, p.VerifyErrors, p.Uncorrectable, p.DataBytes)
	}
	t.Logf("%d fdatasyncs in %v; the image read back whole; scrub clean over %d data bytes", syncs, run, p.DataBytes)
}

// TestBtrfsDirectIOOffAtStart: a staged image volume's device on btrfs
// that an earlier release bound with direct I/O has it turned off when the
// driver starts, with no Node call (a running pod's rewrites would read
// back as EIO until then).
func TestBtrfsDirectIOOffAtStart(t *testing.T) {
	mnt := testfs.FileSystem(t, run, "btrfs", 1<<30, nil, "")
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(mnt, "state")
	cur := newDriver(t, cfg) // the driver running now: the cleanups ask it
	t.Cleanup(func() { cur.Close() })
	r := createReq("img", 64<<20)
	r.Parameters = imageParams
	v, err := cur.CreateVolume(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	id := v.GetVolume().GetVolumeId()
	image := filepath.Join(volumesDir(cur), id+engine.BlockSuffix)
	t.Cleanup(func() {
		if _, err := cur.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("deleting %s: %v", id, err)
			engine.DetachAll(image)
		}
	})
	staging := filepath.Join(t.TempDir(), "staging")
	unmountAll(t, staging)
	if _, err := cur.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := cur.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Errorf("unstaging %s: %v", id, err)
		}
	})
	dev, ok, err := loop.Find(image)
	if err != nil || !ok {
		t.Fatalf("no loop device for the staged image (%v)", err)
	}
	if err := loop.SetDirectIO(dev, true); err != nil {
		t.Fatal(err)
	}
	if err := cur.Close(); err != nil {
		t.Fatal(err)
	}
	cur = newDriver(t, cfg)
	info, err := loop.Status(dev)
	if err != nil {
		t.Fatal(err)
	}
	if info.Flags&unix.LO_FLAGS_DIRECT_IO != 0 {
		t.Fatalf("after the driver's start, %s (bound to an image on btrfs) still has direct I/O", dev.Path())
	}
}
