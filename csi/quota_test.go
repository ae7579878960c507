package csi

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testfs"
)

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	return nil
}

// writeMiB writes n MiB into path, syncing each, and returns the first error.
func writeMiB(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	for i := 0; i < n; i++ {
		if _, err := f.Write(buf); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
	}
	return nil
}

// TestQuotaEnforced: on btrfs with quota groups a pod writing past its
// volume's size gets EDQUOT through the published mount, and expansion
// raises the limit.
func TestQuotaEnforced(t *testing.T) {
	mnt := testfs.FileSystem(t, run, "btrfs", 400<<20, nil, "", []string{"btrfs", "quota", "enable"})
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(mnt, "state")
	d := newDriver(t, cfg)
	if d.defaultPool().Quota != engine.QuotaBtrfs {
		t.Fatalf("quota mode %v on btrfs with quota groups", d.defaultPool().Quota)
	}
	v := mustCreate(t, d, "pvc-quota", 4<<20)
	t.Cleanup(func() { d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}) })
	target := filepath.Join(t.TempDir(), "target")
	unmountAll(t, target)
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.GetVolumeId(), TargetPath: target, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), TargetPath: target})
	})
	if err := writeMiB(filepath.Join(target, "big"), 8); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("writing 8 MiB into a 4 MiB volume: %v, want EDQUOT", err)
	}
	os.Remove(filepath.Join(target, "big"))
	if _, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}}); err != nil {
		t.Fatal(err)
	}
	if err := writeMiB(filepath.Join(target, "big2"), 8); err != nil {
		t.Fatalf("after expansion to 32 MiB: %v", err)
	}
	st, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: v.GetVolumeId(), VolumePath: target})
	if err != nil {
		t.Fatal(err)
	}
	if u := st.GetUsage()[0]; u.GetTotal() != 32<<20 || u.GetUsed() < 8<<20 || u.GetAvailable() > 24<<20 {
		t.Fatalf("stats %v", u)
	}
}

// TestQuotaUnavailable: on a file system without quotas the driver still
// works and accounts.
func TestQuotaUnavailable(t *testing.T) {
	mnt := testfs.FileSystem(t, run, "btrfs", 300<<20, nil, "")
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(mnt, "state")
	d := newDriver(t, cfg)
	if d.defaultPool().Quota != engine.QuotaNone {
		t.Fatalf("quota mode %v with btrfs quota groups off", d.defaultPool().Quota)
	}
	v := mustCreate(t, d, "pvc-noquota", 4<<20)
	if err := writeMiB(filepath.Join(volumeDir(d, v.GetVolumeId()), "big"), 8); err != nil {
		t.Fatalf("without quotas nothing limits the volume: %v", err)
	}
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}
