package bench

import (
	"context"
	"fmt"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// BenchmarkImageClone: a clone of an image volume in use through the CSI
// API (CreateVolume with the volume as its source: on a pool that shares
// blocks one FICLONE, else its allocated extents copied, the file system
// frozen meanwhile; durable when CreateVolume returns) against cp -a of
// the same tree, and cp -a then sync -f, on each fresh pool file system
// in the same run. Goal (issue 27): at least 3x cp -a on ext4.
func BenchmarkImageClone(b *testing.B) {
	testutil.RequireRoot(b)
	ctx := context.Background()
	for _, fs := range fileSystems(b) {
		d := benchDriver(b, fs, "clone")
		for _, ds := range dataSets {
			src, size := source(b, fs, ds)
			capacity := 4*size + 256<<20
			id, mnt := mountedVolume(b, d, fs, "clone-src-"+ds.name, capacity, imageParams)
			// The same tree in the image volume's own file system.
			generate(b, ds, mnt, int64(*sizeMiB)<<20)
			syncFS(mnt)
			seq := 0
			compare(b, fs.name+"/"+ds.name, size, fs, []variant{
				{"ours", func(b *testing.B, _ string) {
					seq++
					v, err := d.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: fmt.Sprintf("clone-%s-%d", ds.name, seq), VolumeCapabilities: []*csipb.VolumeCapability{mountCap},
						CapacityRange: &csipb.CapacityRange{RequiredBytes: capacity}, Parameters: imageParams,
						VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: id}}}})
					b.StopTimer()
					if err != nil {
						b.Fatal(err)
					}
					if _, err := d.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: v.GetVolume().GetVolumeId()}); err != nil {
						b.Fatal(err)
					}
				}},
				{"cp-a", func(b *testing.B, dst string) { run(b, "cp", "-a", src+"/.", dst) }},
				{"cp-a+sync", func(b *testing.B, dst string) {
					run(b, "cp", "-a", src+"/.", dst)
					run(b, "sync", "-f", dst)
				}},
			})
		}
	}
}
