package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	hcsi "github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

var blockSizes = []int64{64 << 20, 1 << 30}

// BenchmarkBlockCreate: a block volume's backing file and loop device,
// in-process (fallocate(2) + LOOP_CONFIGURE) against the shell pair the
// reference driver runs (fallocate, losetup -f --show), same sizes, same
// run. SetBytes is the volume size, so MB/s is "volume bytes provisioned
// per second".
func BenchmarkBlockCreate(b *testing.B) {
	testutil.RequireRoot(b)
	for _, size := range blockSizes {
		b.Run(fmt.Sprintf("size=%dMiB/ours", size>>20), func(b *testing.B) {
			dir := b.TempDir()
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				p := filepath.Join(dir, fmt.Sprintf("v%d.img", i))
				if err := fsops.CreateBackingFile(p, size); err != nil {
					b.Fatal(err)
				}
				dev, err := loop.Attach(p, loop.Options{})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				loop.Detach(dev)
				os.Remove(p)
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("size=%dMiB/fallocate+losetup", size>>20), func(b *testing.B) {
			dir := b.TempDir()
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				p := filepath.Join(dir, fmt.Sprintf("v%d.img", i))
				if out, err := exec.Command("fallocate", "-l", fmt.Sprint(size), p).CombinedOutput(); err != nil {
					b.Fatalf("fallocate: %v %s", err, out)
				}
				out, err := exec.Command("losetup", "-f", "--show", p).Output()
				if err != nil {
					b.Fatalf("losetup: %v", err)
				}
				b.StopTimer()
				exec.Command("losetup", "-d", strings.TrimSpace(string(out))).Run()
				os.Remove(p)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkBlockCreateAPI: block CreateVolume through the driver's CSI
// API (records written durably, backing file, loop device) on the
// journaled ext4 image, against the shell pair on the same file system.
func BenchmarkBlockCreateAPI(b *testing.B) {
	testutil.RequireRoot(b)
	var ext4 *benchFS
	for _, fs := range fileSystems(b) {
		if fs.name == "ext4" {
			ext4 = fs
		}
	}
	if ext4 == nil {
		b.Fatal("no ext4 image")
	}
	blockCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	for r := 0; r < *rounds; r++ {
		for _, size := range blockSizes {
			b.Run(fmt.Sprintf("size=%dMiB/ours-api", size>>20), func(b *testing.B) {
				cfg := engine.Config{DriverName: "bench", Version: "b", NodeID: "n", StateDir: outDir(b, ext4, "state"), MaxVolumeSize: 1 << 40}
				d, err := hcsi.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(size)
				b.StopTimer()
				for i := 0; i < b.N; i++ {
					syncFS(ext4.dir)
					b.StartTimer()
					v, err := d.CreateVolume(context.Background(), &csipb.CreateVolumeRequest{Name: fmt.Sprintf("b%d-%d", r, i),
						VolumeCapabilities: []*csipb.VolumeCapability{blockCap}, CapacityRange: &csipb.CapacityRange{RequiredBytes: size}})
					b.StopTimer()
					if err != nil {
						b.Fatal(err)
					}
					if _, err := d.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: v.GetVolume().GetVolumeId()}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("size=%dMiB/fallocate+losetup", size>>20), func(b *testing.B) {
				dir := outDir(b, ext4, "shell")
				b.SetBytes(size)
				b.StopTimer()
				for i := 0; i < b.N; i++ {
					p := filepath.Join(dir, fmt.Sprintf("v%d.img", i))
					syncFS(ext4.dir)
					b.StartTimer()
					if out, err := exec.Command("fallocate", "-l", fmt.Sprint(size), p).CombinedOutput(); err != nil {
						b.Fatalf("fallocate: %v %s", err, out)
					}
					out, err := exec.Command("losetup", "-f", "--show", p).Output()
					b.StopTimer()
					if err != nil {
						b.Fatalf("losetup: %v", err)
					}
					exec.Command("losetup", "-d", strings.TrimSpace(string(out))).Run()
					os.Remove(p)
				}
			})
		}
	}
}
