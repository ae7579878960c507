package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
