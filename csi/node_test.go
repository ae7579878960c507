package csi

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// mountOf reads what /proc/self/mountinfo says about path.
func mountOf(t *testing.T, path string) *mountinfo.Info {
	t.Helper()
	infos, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) == 0 {
		return nil
	}
	return infos[len(infos)-1]
}

// unmountAll makes sure a failing test leaves nothing mounted.
func unmountAll(t *testing.T, paths ...string) {
	t.Cleanup(func() {
		for _, p := range paths {
			for unix.Unmount(p, unix.MNT_DETACH) == nil {
			}
		}
	})
}

func TestPublishMountVolume(t *testing.T) {
	testutil.RequireRoot(t)
	d := newDriver(t, testConfig(t))
	v := mustCreate(t, d, "pvc-pub", 1<<20)
	id := v.GetVolumeId()
	base := t.TempDir()
	staging, target, ro := filepath.Join(base, "staging"), filepath.Join(base, "target"), filepath.Join(base, "ro")
	unmountAll(t, staging, target, ro)
	os.Mkdir(staging, 0o750)

	for i := 0; i < 2; i++ { // idempotent
		if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
	}
	if m := mountOf(t, staging); m == nil || !strings.HasSuffix(m.Root, "/"+id) {
		t.Fatalf("staging mount: %+v", m)
	}
	caps := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "nosuid", "nodev", "noexec")
	for i := 0; i < 2; i++ {
		if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: caps}); err != nil {
			t.Fatal(err)
		}
	}
	m := mountOf(t, target)
	if m == nil {
		t.Fatal("target not mounted")
	}
	for _, opt := range []string{"rw", "nosuid", "nodev", "noexec"} {
		if !strings.Contains(","+m.Options+",", ","+opt+",") {
			t.Errorf("target options %q lack %s", m.Options, opt)
		}
	}
	if err := os.WriteFile(filepath.Join(target, "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(volumeDir(d, id), "hello")); err != nil || string(b) != "hi" {
		t.Fatalf("write through the mount did not reach the volume: %q %v", b, err)
	}

	// Read-only publication: mountinfo says ro and writes fail with EROFS.
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: ro, VolumeCapability: rwo, Readonly: true}); err != nil {
		t.Fatal(err)
	}
	if m := mountOf(t, ro); m == nil || !strings.HasPrefix(m.Options, "ro") {
		t.Fatalf("read-only target: %+v", m)
	}
	if err := os.WriteFile(filepath.Join(ro, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("write to read-only publication: %v", err)
	}
	// Same target, other read-only flag: incompatible.
	_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: ro, VolumeCapability: rwo})
	wantCode(t, err, codes.AlreadyExists)

	// Another volume on an occupied target.
	other := mustCreate(t, d, "pvc-other", 1<<20)
	_, err = d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: other.GetVolumeId(), TargetPath: target, VolumeCapability: rwo})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: other.GetVolumeId(), TargetPath: target})
	wantCode(t, err, codes.FailedPrecondition)

	// A mounted volume cannot be deleted.
	_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.FailedPrecondition)

	stats, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	if err != nil || stats.GetUsage()[0].GetTotal() != 1<<20 || stats.GetUsage()[1].GetUsed() != 2 {
		t.Fatalf("stats: %v %v", stats, err)
	}
	_, err = d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: base})
	wantCode(t, err, codes.NotFound)

	for _, p := range []string{target, ro} {
		for i := 0; i < 2; i++ {
			if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: p}); err != nil {
				t.Fatal(err)
			}
		}
		if mountOf(t, p) != nil {
			t.Fatalf("%s still mounted", p)
		}
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("target %s not removed", p)
		}
	}
	if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if mountOf(t, staging) != nil {
		t.Fatal("staging still mounted")
	}
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}

func TestNodeHostilePaths(t *testing.T) {
	testutil.RequireRoot(t)
	d := newDriver(t, testConfig(t))
	v := mustCreate(t, d, "pvc-hostile", 1<<20)
	base := t.TempDir()
	link := filepath.Join(base, "link")
	rel, _ := filepath.Rel(base, stateRoot(d))
	os.Symlink(stateRoot(d), link)
	unmountAll(t, stateRoot(d)+"/tmp/x", link+"/x")
	tests := []struct {
		name, volume, target string
		code                 codes.Code
	}{
		{"relative target", v.GetVolumeId(), "relative/path", codes.InvalidArgument},
		{"target in state dir", v.GetVolumeId(), stateRoot(d) + "/tmp/x", codes.InvalidArgument},
		{"target through symlink into state dir", v.GetVolumeId(), link + "/x", codes.InvalidArgument},
		{"dot-dot into state dir", v.GetVolumeId(), base + "/" + rel + "/x", codes.InvalidArgument},
		{"NUL in target", v.GetVolumeId(), base + "/a\x00b", codes.InvalidArgument},
		{"traversal id", "../../etc", base + "/t", codes.NotFound},
		{"unknown id", engine.NewID(engine.VolumeIDPrefix, d.eng.Tag), base + "/t", codes.NotFound},
		{"id of another node", engine.NewID(engine.VolumeIDPrefix, engine.NodeTag("node-2")), base + "/t", codes.ResourceExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: tc.volume, TargetPath: tc.target, VolumeCapability: rwo})
			wantCode(t, err, tc.code)
		})
	}
	if entries, _ := os.ReadDir(base); len(entries) != 1 {
		t.Fatalf("refused requests created %v", entries)
	}
}

func TestPublishBlockVolume(t *testing.T) {
	testutil.RequireRoot(t)
	d := newDriver(t, testConfig(t))
	r, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "blk", VolumeCapabilities: []*csi.VolumeCapability{blockCap()},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	v := r.GetVolume()
	t.Cleanup(func() { d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}) })
	if v.GetCapacityBytes() != 1024 {
		t.Fatalf("1000 bytes must round up to 1024, got %d", v.GetCapacityBytes())
	}
	target := filepath.Join(t.TempDir(), "dev")
	unmountAll(t, target)
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.GetVolumeId(), TargetPath: target, VolumeCapability: blockCap()}); err != nil {
		t.Fatal(err)
	}
	if size, err := loop.Size(target); err != nil || size != 1024 {
		t.Fatalf("device at target: %d %v", size, err)
	}
	if _, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}}); err != nil {
		t.Fatal(err)
	}
	if size, err := loop.Size(target); err != nil || size != 4<<20 {
		t.Fatalf("after expansion the published device has %d bytes (%v), want %d", size, err, 4<<20)
	}

	// Read-only publication: the device itself refuses writes.
	roTarget := filepath.Join(filepath.Dir(target), "ro-dev")
	unmountAll(t, roTarget)
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.GetVolumeId(), TargetPath: roTarget, VolumeCapability: blockCap(), Readonly: true}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(volumesDir(d), v.GetVolumeId()+".img")
	if devs, _ := loop.FindAll(path); len(devs) != 2 {
		t.Fatalf("want a writable and a read-only device, got %+v", devs)
	}
	f, err := os.OpenFile(roTarget, os.O_WRONLY, 0)
	if err == nil {
		_, err = f.Write(make([]byte, 512))
		f.Close()
	}
	if err == nil {
		t.Fatal("wrote through a read-only block publication")
	}
	for _, p := range []string{target, roTarget} {
		if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), TargetPath: p}); err != nil {
			t.Fatal(err)
		}
	}
	if devs, _ := loop.FindAll(path); len(devs) != 1 || devs[0].ReadOnly {
		t.Fatalf("after unpublishing, want only the writable device, got %+v", devs)
	}
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("backing file left behind")
	}
}

func unmount(p string) error { return unix.Unmount(p, unix.MNT_DETACH) }
