package bench

import (
	"context"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	hcsi "github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
)

// mountCap is a single-node writer's mount capability.
var mountCap = &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
	AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}

// imageParams are a StorageClass's parameters for image volumes.
var imageParams = map[string]string{engine.ParamLayout: engine.LayoutImage}

// benchDriver is a driver whose state dir (its default pool) is on fs,
// closed at the end.
func benchDriver(b *testing.B, fs *benchFS, what string) *hcsi.Driver {
	d, err := hcsi.New(engine.Config{DriverName: "bench", Version: "b", NodeID: "n", StateDir: outDir(b, fs, what+"-state"), MaxVolumeSize: 1 << 40})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

// mountedVolume makes a mount volume of size with a class's params in d,
// stages it (an image volume's file system is mounted there) and
// publishes it, as kubelet does for a pod; it returns the volume's id and
// the pod's path. All is undone at the end.
func mountedVolume(b *testing.B, d *hcsi.Driver, fs *benchFS, name string, size int64, params map[string]string) (string, string) {
	ctx := context.Background()
	v, err := d.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csipb.VolumeCapability{mountCap},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: size}, Parameters: params})
	if err != nil {
		b.Fatal(err)
	}
	id := v.GetVolume().GetVolumeId()
	b.Cleanup(func() { d.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id}) })
	staging, target := outDir(b, fs, name+"-staging"), outDir(b, fs, name+"-target")
	if _, err := d.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := d.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			unix.Unmount(staging, unix.MNT_DETACH)
		}
	})
	if _, err := d.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := d.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			unix.Unmount(target, unix.MNT_DETACH)
		}
	})
	return id, target
}
