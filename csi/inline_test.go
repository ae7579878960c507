package csi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

func TestEphemeralInlineVolume(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	target := filepath.Join(t.TempDir(), "pod", "vol")
	unmountAll(t, target)
	vctx := map[string]string{engine.CtxEphemeral: "true", engine.CtxSize: "10Mi", "csi.storage.k8s.io/pod.name": "p"}
	req := &csi.NodePublishVolumeRequest{VolumeId: "csi-0123abcd", TargetPath: target, VolumeCapability: rwo, VolumeContext: vctx}
	for i := 0; i < 2; i++ {
		if _, err := d.NodePublishVolume(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	v, ok := d.eng.LookupNodeVolume("csi-0123abcd")
	if !ok || v.CapacityBytes != 10<<20 || mountOf(t, target) == nil {
		t.Fatalf("inline volume %+v mounted=%v", v, mountOf(t, target) != nil)
	}
	// A directory volume is data: its device nodes and setuid programs
	// are inert.
	if opts := mountOf(t, target).Options; !strings.Contains(","+opts+",", ",nosuid,") || !strings.Contains(","+opts+",", ",nodev,") {
		t.Fatalf("inline volume mounted %q, want nosuid and nodev", opts)
	}
	os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o644)
	if l, _ := d.ListVolumes(ctx, &csi.ListVolumesRequest{}); len(l.GetEntries()) != 0 {
		t.Fatal("inline volume listed to the CO")
	}
	// A driver restart while the pod runs keeps it.
	d2 := newDriver(t, cfg)
	if _, ok := d2.eng.LookupNodeVolume("csi-0123abcd"); !ok {
		t.Fatal("restart dropped a published inline volume")
	}
	if _, err := d2.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-0123abcd", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, ok := d2.eng.LookupNodeVolume("csi-0123abcd"); ok {
		t.Fatal("inline volume outlived its unpublish")
	}
	if _, err := os.Stat(d2.eng.VolumeDataPath(v)); !os.IsNotExist(err) {
		t.Fatal("inline volume's data left behind")
	}
	// Crash after publish: the target is gone at the next start.
	target2 := filepath.Join(t.TempDir(), "vol2")
	unmountAll(t, target2)
	if _, err := d2.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "csi-crash", TargetPath: target2, VolumeCapability: rwo, VolumeContext: map[string]string{engine.CtxEphemeral: "true"}}); err != nil {
		t.Fatal(err)
	}
	v2, _ := d2.eng.LookupNodeVolume("csi-crash")
	os.Stat(target2)
	for unmount(target2) == nil {
	}
	d3 := newDriver(t, cfg)
	if _, ok := d3.eng.LookupNodeVolume("csi-crash"); ok {
		t.Fatal("an inline volume nobody mounts survived the restart")
	}
	if _, err := os.Stat(d3.eng.VolumeDataPath(v2)); !os.IsNotExist(err) {
		t.Fatal("its data survived too")
	}
	for _, bad := range []map[string]string{{engine.CtxEphemeral: "true", engine.CtxSize: "lots"}, {engine.CtxEphemeral: "true", "color": "red"}} {
		_, err := d3.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "csi-bad", TargetPath: target2, VolumeCapability: rwo, VolumeContext: bad})
		wantCode(t, err, codes.InvalidArgument)
	}
}

func TestLocalVolume(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	root := filepath.Join(base, "disks")
	os.MkdirAll(filepath.Join(root, "ssd1"), 0o755)
	os.WriteFile(filepath.Join(root, "ssd1", "data"), []byte("local"), 0o644)
	os.MkdirAll(filepath.Join(base, "elsewhere"), 0o755)
	os.Symlink(filepath.Join(base, "elsewhere"), filepath.Join(root, "escape"))
	cfg := testConfig(t)
	cfg.LocalRoots = []string{root}
	d := newDriver(t, cfg)
	target := filepath.Join(base, "target")
	unmountAll(t, target)
	pub := func(path string) error {
		_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "pv-local-1", TargetPath: target, VolumeCapability: rwo, VolumeContext: map[string]string{engine.CtxLocalPath: path}})
		return err
	}
	tests := []struct {
		path string
		code codes.Code
		msg  string
	}{
		{filepath.Join(root, "missing"), codes.NotFound, filepath.Join(root, "missing")},
		{filepath.Join(base, "elsewhere"), codes.PermissionDenied, "outside the allowed roots"},
		{filepath.Join(root, "escape"), codes.PermissionDenied, "outside the allowed roots"},
		{"relative", codes.InvalidArgument, "absolute"},
	}
	for _, tc := range tests {
		err := pub(tc.path)
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v naming %q", tc.path, err, tc.code, tc.msg)
		}
	}
	for i := 0; i < 2; i++ { // an already-mounted target is success
		if err := pub(filepath.Join(root, "ssd1")); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(target, "data")); string(b) != "local" {
		t.Fatal("local path not visible at the target")
	}
	if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "pv-local-1", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "ssd1", "data")); string(b) != "local" {
		t.Fatal("unpublishing a local volume touched its data")
	}
	if _, ok := d.eng.LookupNodeVolume("pv-local-1"); ok {
		t.Fatal("local volume record outlived its publication")
	}
}

// A state dir that refuses the record of a new inline volume leaves no
// reservation behind: once it takes writes again, the same publish works
// (it used to answer "being created by another request" until restart).
func TestInlineRecordWriteFailureReleasesName(t *testing.T) {
	testutil.RequireRoot(t)
	d := newDriver(t, testConfig(t))
	target := filepath.Join(t.TempDir(), "pod", "vol")
	unmountAll(t, target)
	recs := filepath.Join(metaDir(d), "volumes")
	if err := unix.Mount(recs, recs, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(recs, unix.MNT_DETACH) })
	if err := unix.Mount("", recs, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	req := &csi.NodePublishVolumeRequest{VolumeId: "csi-readonly-state", TargetPath: target, VolumeCapability: rwo,
		VolumeContext: map[string]string{engine.CtxEphemeral: "true"}}
	_, err := d.NodePublishVolume(ctx, req)
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("refusal does not say the state is read-only: %v", err)
	}
	if _, ok := volumeNamed(d, engine.EphemeralPrefix+"csi-readonly-state"); ok {
		t.Fatal("the failed create kept its reservation")
	}
	if err := unix.Unmount(recs, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodePublishVolume(ctx, req); err != nil {
		t.Fatalf("publish once the state dir takes writes: %v", err)
	}
	if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-readonly-state", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
}

// TestInlineSizeCap: an inline ephemeral volume larger than
// --max-inline-size is refused OutOfRange with the flag and the way out
// named, before anything is made; one within it is made.
func TestInlineSizeCap(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	cfg.MaxInlineSize = 64 << 20
	d := newDriver(t, cfg)
	for _, c := range []struct {
		size string
		code codes.Code
	}{
		{"16Ti", codes.OutOfRange},
		{"65Mi", codes.OutOfRange},
		{"64Mi", codes.OK},
	} {
		target := filepath.Join(t.TempDir(), "vol")
		unmountAll(t, target)
		id := "csi-cap-" + c.size
		_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: rwo,
			VolumeContext: map[string]string{engine.CtxEphemeral: "true", engine.CtxSize: c.size}})
		if status.Code(err) != c.code || (err != nil && !strings.Contains(err.Error(), "--max-inline-size")) {
			t.Fatalf("an inline volume of %s: %v, want %v naming the flag", c.size, err, c.code)
		}
		_, made := d.eng.LookupNodeVolume(id)
		if made != (c.code == codes.OK) {
			t.Fatalf("an inline volume of %s: made %v", c.size, made)
		}
		if made {
			if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
				t.Fatal(err)
			}
		}
	}
}
