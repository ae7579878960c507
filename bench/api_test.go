package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	hcsi "github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// BenchmarkZstdAPI: a zstd snapshot and its restore through the CSI API
// (CreateSnapshot with compression zstd; CreateVolume from it), as a user
// gets them, against `tar -I 'zstd -T0 -3' -cf` and `tar -I zstd -xf` of
// the same tree in the same run. The driver's snapshot and restore are
// durable when they return (the archive fsynced, the restored tree's file
// system synced before the volume is recorded ready); the shell tools'
// are not, so each is also run followed by `sync -f` ("+sync"), what a
// user who needs the result to survive a power loss runs. Goals: the
// snapshot 1.5x and the restore 1.3x the plain tools.
func BenchmarkZstdAPI(b *testing.B) {
	testutil.RequireRoot(b)
	mount := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	ctx := context.Background()
	for _, fs := range fileSystems(b) {
		if fs.name == "btrfs" {
			continue
		}
		for _, ds := range dataSets {
			src, size := source(b, fs, ds)
			state := outDir(b, fs, "api-state")
			d, err := hcsi.New(engine.Config{DriverName: "bench", Version: "b", NodeID: "n", StateDir: state, MaxVolumeSize: 1 << 40})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { d.Close() })
			vol, err := d.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "src", VolumeCapabilities: []*csipb.VolumeCapability{mount},
				CapacityRange: &csipb.CapacityRange{RequiredBytes: size + 64<<20}})
			if err != nil {
				b.Fatal(err)
			}
			volDir := filepath.Join(state, "volumes", vol.GetVolume().GetVolumeId())
			if _, err := fsops.CopyTree(ctx, src, volDir); err != nil {
				b.Fatal(err)
			}
			syncFS(volDir)
			seq := 0
			var lastSnap string
			snapshot := func(b *testing.B, _ string) {
				seq++
				s, err := testutil.SnapshotReady(ctx, d.CreateSnapshot, &csipb.CreateSnapshotRequest{Name: fmt.Sprint("s", seq), SourceVolumeId: vol.GetVolume().GetVolumeId(),
					Parameters: map[string]string{"compression": "zstd"}})
				if err != nil {
					b.Fatal(err)
				}
				lastSnap = s.GetSnapshot().GetSnapshotId()
			}
			// One snapshot to restore from, made before the timed runs.
			snapshot(b, "")
			restoreFrom := lastSnap
			archive := filepath.Join(state, "snapshots", restoreFrom+".tar.zst")
			restore := func(b *testing.B, _ string) {
				seq++
				v, err := d.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: fmt.Sprint("r", seq), VolumeCapabilities: []*csipb.VolumeCapability{mount},
					CapacityRange:       &csipb.CapacityRange{RequiredBytes: size + 64<<20},
					VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: restoreFrom}}}})
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := d.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: v.GetVolume().GetVolumeId()}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			compare(b, "snapshot/"+fs.name+"/"+ds.name, size, fs, []variant{
				{"ours-zstd", snapshot},
				{"tar-zstd-T0-3", func(b *testing.B, dst string) {
					run(b, "tar", "-I", "zstd -T0 -3", "-cf", filepath.Join(dst, "s.tar.zst"), "-C", volDir, ".")
				}},
				{"tar-zstd-T0-3+sync", func(b *testing.B, dst string) {
					run(b, "tar", "-I", "zstd -T0 -3", "-cf", filepath.Join(dst, "s.tar.zst"), "-C", volDir, ".")
					run(b, "sync", "-f", dst)
				}},
			})
			compare(b, "restore/"+fs.name+"/"+ds.name, size, fs, []variant{
				{"ours-zstd", restore},
				{"tar-I-zstd-xf", func(b *testing.B, dst string) { run(b, "tar", "-I", "zstd", "-xf", archive, "-C", dst) }},
				{"tar-I-zstd-xf+sync", func(b *testing.B, dst string) {
					run(b, "tar", "-I", "zstd", "-xf", archive, "-C", dst)
					run(b, "sync", "-f", dst)
				}},
			})
		}
	}
}
