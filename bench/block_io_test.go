package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// BenchmarkBlockIO: fio (the same jobs as BenchmarkImageIO) on a block
// volume's loop device as the driver binds it, with direct I/O ("ours"),
// on the same device switched to buffered I/O as it was bound before
// (LOOP_SET_DIRECT_IO off: "buffered"), and on a file in the pool itself,
// all O_DIRECT, on each fresh pool file system, in the same run. The
// device is written once first, so reads are of data, not holes.
func BenchmarkBlockIO(b *testing.B) {
	testutil.RequireRoot(b)
	if !have("fio") {
		b.Fatal("fio is needed (make deps installs it)")
	}
	ctx := context.Background()
	blockCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	for _, fs := range fileSystems(b) {
		d := benchDriver(b, fs, "blockio")
		v, err := d.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "blockio", VolumeCapabilities: []*csipb.VolumeCapability{blockCap},
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 1 << 30}})
		if err != nil {
			b.Fatal(err)
		}
		id := v.GetVolume().GetVolumeId()
		b.Cleanup(func() { d.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id}) })
		rec, _ := d.Engine().Records.Volumes.Get(id)
		dev, ok, err := loop.Find(d.Engine().VolumeDataPath(rec))
		if err != nil || !ok {
			b.Fatalf("the block volume's device: %v", err)
		}
		info, err := loop.Status(dev)
		if err != nil {
			b.Fatal(err)
		}
		bound := info.Flags&unix.LO_FLAGS_DIRECT_IO != 0
		b.Logf("%s: the block volume's %s is bound with direct I/O: %v", fs.name, dev.Path(), bound)
		beside := filepath.Join(outDir(b, fs, "blockio-pool"), "fio.dat")
		for _, f := range []string{dev.Path(), beside} {
			fio(b, f, "write", "1m", 4, "256m")
		}
		defer os.Remove(beside)
		setDIO := func(on bool) {
			if !bound {
				return // the pool refuses it: both runs are buffered
			}
			if err := loop.SetDirectIO(dev, on); err != nil {
				b.Fatalf("direct I/O %v on %s: %v", on, dev.Path(), err)
			}
		}
		for _, j := range fioJobs {
			for r := 0; r < *rounds; r++ {
				for _, c := range []struct {
					name, file string
					dio        bool
				}{{"ours", dev.Path(), true}, {"buffered", dev.Path(), false}, {"pool-file", beside, true}} {
					setDIO(c.dio)
					fioRun(b, fmt.Sprintf("%s/%s/%s", fs.name, j.name, c.name), c.file, j)
				}
			}
		}
		setDIO(true)
	}
}
