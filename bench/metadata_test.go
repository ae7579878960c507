package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	hcsi "github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// deltaStream collects what GetMetadataDelta sends.
type deltaStream struct {
	grpc.ServerStream
	ranges int
}

func (s *deltaStream) Send(r *csipb.GetMetadataDeltaResponse) error {
	s.ranges += len(r.GetBlockMetadata())
	return nil
}

func (s *deltaStream) Context() context.Context { return context.Background() }

// BenchmarkSnapshotDelta: the changed ranges between two snapshots of an
// image volume (GetMetadataDelta, what an incremental block backup asks
// for) against cmp -l of the same two snapshot images, which reads both
// whole, on each fresh pool file system in the same run. The volume holds
// -bench.size*8 MiB of written data, and 4 MiB of it is rewritten between
// the snapshots. On XFS and btrfs the snapshots are reflinks, and blocks
// both share are not read.
func BenchmarkSnapshotDelta(b *testing.B) {
	testutil.RequireRoot(b)
	if !have("cmp") {
		b.Fatal("cmp (diffutils) is needed")
	}
	data := int64(*sizeMiB) * 8 << 20
	for _, fs := range fileSystems(b) {
		d, err := hcsi.New(engine.Config{DriverName: "bench", Version: "b", NodeID: "n", StateDir: outDir(b, fs, "delta-state"), MaxVolumeSize: 1 << 40, EnableSnapshotMetadata: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Close() })
		id, mnt := mountedVolume(b, d, fs, "delta", data+512<<20, imageParams)
		file := filepath.Join(mnt, "data")
		writeRandom(b, file, 0, data, true)
		s1 := snapshotOf(b, d, id, "delta-1")
		touchBlocks(b, file, data/2, 4<<20)
		s2 := snapshotOf(b, d, id, "delta-2")
		p1, p2 := snapshotImage(b, d, s1), snapshotImage(b, d, s2)
		for r := 0; r < *rounds; r++ {
			b.Run(fmt.Sprintf("%s/ours", fs.name), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					st := &deltaStream{}
					if err := d.GetMetadataDelta(&csipb.GetMetadataDeltaRequest{BaseSnapshotId: s1, TargetSnapshotId: s2}, st); err != nil {
						b.Fatal(err)
					}
					if st.ranges == 0 {
						b.Fatal("no changed range between the snapshots")
					}
				}
				b.ReportMetric(float64(comparedBytes(b, p1, p2))/(1<<20), "MiB-read")
			})
			b.Run(fmt.Sprintf("%s/cmp-l", fs.name), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					// Into a pipe: GNU cmp given /dev/null stops at
					// the first difference, as cmp -s does.
					cmd := exec.Command("cmp", "-l", p1, p2)
					cmd.Stdout = io.Discard
					err := cmd.Run()
					var exit *exec.ExitError
					if !errors.As(err, &exit) || exit.ExitCode() != 1 { // 1: they differ
						b.Fatalf("cmp -l: %v, want exit status 1", err)
					}
				}
			})
		}
	}
}

// writeRandom writes n random bytes into file at off, fsynced.
func writeRandom(b *testing.B, file string, off, n int64, create bool) {
	flags := os.O_WRONLY
	if create {
		flags |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(file, flags, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	for done := int64(0); done < n; done += int64(len(buf)) {
		rand.Read(buf)
		if _, err := f.WriteAt(buf[:min(int64(len(buf)), n-done)], off+done); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
}

// touchBlocks changes one byte in each 4 KiB block of file from off for
// n bytes, fsynced: every block of the range is rewritten (in the
// volume's file system and so in its image), and cmp -l has a line per
// block to print, not one per byte.
func touchBlocks(b *testing.B, file string, off, n int64) {
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	one := make([]byte, 1)
	for at := off; at < off+n; at += 4096 {
		if _, err := f.ReadAt(one, at); err != nil {
			b.Fatal(err)
		}
		one[0] ^= 0xff
		if _, err := f.WriteAt(one, at); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
}

// comparedBytes is what the comparison of two snapshot images reads of
// each (outside the timing).
func comparedBytes(b *testing.B, p1, p2 string) int64 {
	b.StopTimer()
	defer b.StartTimer()
	f1, err := os.Open(p1)
	if err != nil {
		b.Fatal(err)
	}
	defer f1.Close()
	f2, err := os.Open(p2)
	if err != nil {
		b.Fatal(err)
	}
	defer f2.Close()
	st, _ := f2.Stat()
	c, err := fsops.CompareRanges(f1, f2, 0, st.Size(), engine.DeltaBlock)
	if err != nil {
		b.Fatal(err)
	}
	return c.Read
}

// snapshotOf snapshots volume id through the API and returns its id.
func snapshotOf(b *testing.B, d *hcsi.Driver, id, name string) string {
	s, err := testutil.SnapshotReady(context.Background(), d.CreateSnapshot, &csipb.CreateSnapshotRequest{Name: name, SourceVolumeId: id})
	if err != nil {
		b.Fatal(err)
	}
	sid := s.GetSnapshot().GetSnapshotId()
	b.Cleanup(func() { d.DeleteSnapshot(context.Background(), &csipb.DeleteSnapshotRequest{SnapshotId: sid}) })
	return sid
}

// snapshotImage is the file of snapshot id.
func snapshotImage(b *testing.B, d *hcsi.Driver, id string) string {
	s, ok := d.Engine().Records.Snapshots.Get(id)
	if !ok {
		b.Fatalf("no record of snapshot %s", id)
	}
	return d.Engine().SnapshotDataPath(s)
}
