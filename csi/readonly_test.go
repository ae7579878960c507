package csi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// A state dir whose file system turns read-only while the driver runs (an
// ext4 that hit an error, an operator's remount): every change is refused
// with a message that says so, nothing half-made is listed, health
// reports it, reads keep working, and once it is writable again the same
// requests succeed.
func TestStateDirTurnsReadOnly(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", cfg.StateDir, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(cfg.StateDir, unix.MNT_DETACH) })
	d := newDriver(t, cfg)
	src := mustCreate(t, d, "pvc-src", 1<<20).GetVolumeId()
	if err := os.WriteFile(filepath.Join(volumeDir(d, src), "f"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	remount := func(flags uintptr) {
		t.Helper()
		if err := unix.Mount("", cfg.StateDir, "", unix.MS_REMOUNT|flags, "size=64m"); err != nil {
			t.Fatal(err)
		}
	}
	remount(unix.MS_RDONLY)
	listed := func() int {
		l, err := d.ListVolumes(ctx, &csi.ListVolumesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.GetEntries())
	}
	clone := createReq("pvc-clone", 1<<20)
	clone.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src}}}
	calls := map[string]func() error{
		"CreateVolume":   func() error { _, err := d.CreateVolume(ctx, createReq("pvc-new", 1<<20)); return err },
		"clone":          func() error { _, err := d.CreateVolume(ctx, clone); return err },
		"CreateSnapshot": func() error { _, err := d.CreateSnapshot(ctx, snapReq("snap", src, nil)); return err },
		"DeleteVolume":   func() error { _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: src}); return err },
		"ControllerExpandVolume": func() error {
			_, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: src, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}})
			return err
		},
	}
	for name, call := range calls {
		err := call()
		wantCode(t, err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), "read-only") {
			t.Errorf("%s: the refusal does not say the state dir is read-only: %v", name, err)
		}
	}
	if n := listed(); n != 1 {
		t.Fatalf("%d volumes listed while read-only, want the 1 that exists", n)
	}
	if _, err := d.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: src}); err != nil {
		t.Fatalf("reads must keep working: %v", err)
	}
	h, err := d.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || len(h.GetBackendHealth()) == 0 || h.GetBackendHealth()[0].GetReason() != "StateDirNotWritable" {
		t.Fatalf("storage health while read-only: %v %v", h, err)
	}
	remount(0)
	for _, name := range []string{"CreateVolume", "clone", "CreateSnapshot", "ControllerExpandVolume"} {
		if err := calls[name](); err != nil {
			t.Fatalf("%s once writable again: %v", name, err)
		}
	}
	if n := listed(); n != 3 {
		t.Fatalf("%d volumes listed, want 3", n)
	}
}
