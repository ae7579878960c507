package upgrade

import (
	"os"
	"path/filepath"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/loop"
	"golang.org/x/sys/unix"
)

// image is an image volume the upgrade test makes with the current build.
type image struct {
	id, staging string
}

// imageVolume makes an image volume in state, stages it, writes content
// into a file on its file system and unstages it. Whatever fails later,
// its mount and loop device do not outlive the test.
func imageVolume(t *testing.T, d *driver, state, dir, content string) *image {
	t.Helper()
	r, err := d.ctl().CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "image-by-current", VolumeCapabilities: []*csipb.VolumeCapability{mountCap},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 32 << 20}, Parameters: map[string]string{"layout": "image"}})
	if err != nil {
		t.Fatal(err)
	}
	img := &image{id: r.GetVolume().GetVolumeId(), staging: filepath.Join(dir, "image-staging")}
	t.Cleanup(func() {
		unix.Unmount(img.staging, unix.MNT_DETACH)
		devs, _ := loop.FindAll(filepath.Join(state, "volumes", img.id+".img"))
		for _, dev := range devs {
			loop.Detach(dev)
		}
	})
	img.stage(t, d)
	if err := os.WriteFile(filepath.Join(img.staging, "f"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	img.unstage(t, d)
	return img
}

func (img *image) stage(t *testing.T, d *driver) {
	t.Helper()
	if _, err := d.node().NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: img.id, StagingTargetPath: img.staging, VolumeCapability: mountCap}); err != nil {
		t.Fatalf("staging image volume %s: %v", img.id, err)
	}
}

func (img *image) unstage(t *testing.T, d *driver) {
	t.Helper()
	if _, err := d.node().NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: img.id, StagingTargetPath: img.staging}); err != nil {
		t.Fatalf("unstaging image volume %s: %v", img.id, err)
	}
}

// check stages the volume again and reads the file back.
func (img *image) check(t *testing.T, d *driver, content string) {
	t.Helper()
	img.stage(t, d)
	defer img.unstage(t, d)
	if b, err := os.ReadFile(filepath.Join(img.staging, "f")); err != nil || string(b) != content {
		t.Fatalf("image volume %s after the restart: %q (%v), want %q", img.id, b, err, content)
	}
}

func (img *image) remove(t *testing.T, d *driver) {
	t.Helper()
	if _, err := d.ctl().DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: img.id}); err != nil {
		t.Fatalf("deleting image volume %s: %v", img.id, err)
	}
}
