package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/hostpath-csi/hostpath/archive"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

var (
	memGiB    = flag.Int("mem.gib", 0, "GiB of data for BenchmarkSnapshotMemory (0: 64 MiB; make scale uses 10)")
	manyFiles = flag.Int("many.files", 20000, "empty files for BenchmarkManyFiles (make scale uses 1000000)")
)

// BenchmarkSnapshotMemory snapshots and restores one large volume and
// reports the peak resident memory each takes: it must not grow with the
// volume (the target is under 64 MiB extra whatever the size).
func BenchmarkSnapshotMemory(b *testing.B) {
	testutil.RequireRoot(b)
	size := int64(64 << 20)
	if *memGiB > 0 {
		size = int64(*memGiB) << 30
	}
	dir := b.TempDir()
	src := filepath.Join(dir, "vol")
	os.Mkdir(src, 0o755)
	f, err := os.Create(filepath.Join(src, "big"))
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 4<<20)
	r := rand.New(rand.NewPCG(5, 5))
	fillText(r, chunk)
	for off := int64(0); off < size; off += int64(len(chunk)) {
		chunk[0], chunk[1] = byte(off>>20), byte(off>>28) // vary the chunks a little
		if _, err := f.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	f.Close()
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		out, err := os.Create(filepath.Join(dir, fmt.Sprintf("snap-%d.tar.gz", i)))
		if err != nil {
			b.Fatal(err)
		}
		resetPeakRSS()
		if _, err := archive.Write(context.Background(), src, out, archive.Options{}); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(peakRSSMiB(), "snapshot-peakRSS-MiB")
		out.Seek(0, 0)
		dst := filepath.Join(dir, fmt.Sprintf("restore-%d", i))
		os.Mkdir(dst, 0o755)
		resetPeakRSS()
		if _, err := archive.Extract(context.Background(), out, dst); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(peakRSSMiB(), "restore-peakRSS-MiB")
		out.Close()
		os.Remove(out.Name())
		os.RemoveAll(dst)
	}
}

// BenchmarkManyFiles clones, snapshots and restores a volume of many
// empty files (a million with make scale), reporting time and memory.
func BenchmarkManyFiles(b *testing.B) {
	testutil.RequireRoot(b)
	dir := b.TempDir()
	src := filepath.Join(dir, "vol")
	for i := 0; i < *manyFiles; i++ {
		sub := filepath.Join(src, fmt.Sprintf("d%04d", i/1000))
		if i%1000 == 0 {
			os.MkdirAll(sub, 0o755)
		}
		f, err := os.Create(filepath.Join(sub, fmt.Sprintf("f%06d", i)))
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst := filepath.Join(dir, fmt.Sprintf("clone-%d", i))
		os.Mkdir(dst, 0o755)
		resetPeakRSS()
		st, err := fsops.CopyTree(context.Background(), src, dst)
		if err != nil || st.Files != int64(*manyFiles) {
			b.Fatalf("clone: %+v %v", st, err)
		}
		b.ReportMetric(peakRSSMiB(), "clone-peakRSS-MiB")
		out, _ := os.Create(filepath.Join(dir, "snap.tar.gz"))
		resetPeakRSS()
		if _, err := archive.Write(context.Background(), src, out, archive.Options{}); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(peakRSSMiB(), "snapshot-peakRSS-MiB")
		out.Seek(0, 0)
		rdst := filepath.Join(dir, fmt.Sprintf("restore-%d", i))
		os.Mkdir(rdst, 0o755)
		resetPeakRSS()
		rs, err := archive.Extract(context.Background(), out, rdst)
		if err != nil || rs.Files != int64(*manyFiles) {
			b.Fatalf("restore: %+v %v", rs, err)
		}
		b.ReportMetric(peakRSSMiB(), "restore-peakRSS-MiB")
		out.Close()
	}
}

// BenchmarkHeavyMemory runs as many zstd and gzip restores at once as the
// driver allows (--max-heavy-operations, 4 by default) of one large-file
// volume of -bench.size MiB (256 in make bench; the DaemonSet's memory
// limit is made from what they add at that size) and reports the peak
// resident memory they add. Run it with -cpu 2,8,32 to see that it no
// longer grows with the core count.
func BenchmarkHeavyMemory(b *testing.B) {
	testutil.RequireRoot(b)
	const heavy = 4
	dir := b.TempDir()
	src := filepath.Join(dir, "vol")
	os.Mkdir(src, 0o755)
	chunk := make([]byte, 4<<20)
	fillText(rand.New(rand.NewPCG(7, 7)), chunk)
	f, err := os.Create(filepath.Join(src, "big"))
	if err != nil {
		b.Fatal(err)
	}
	for off := 0; off < max(*sizeMiB, 4)<<20; off += len(chunk) {
		chunk[0] = byte(off >> 20)
		f.Write(chunk)
	}
	f.Close()
	for _, zst := range []bool{true, false} {
		snap := filepath.Join(dir, fmt.Sprintf("snap-%v", zst))
		out, err := os.Create(snap)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := archive.Write(context.Background(), src, out, archive.Options{Zstd: zst}); err != nil {
			b.Fatal(err)
		}
		out.Close()
		name := "gzip"
		if zst {
			name = "zstd"
		}
		b.Run(name+"-snapshots", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				debug.FreeOSMemory()
				resetPeakRSS()
				errs := make(chan error, heavy)
				for j := 0; j < heavy; j++ {
					go func() {
						_, err := archive.Write(context.Background(), src, io.Discard, archive.Options{Zstd: zst})
						errs <- err
					}()
				}
				for j := 0; j < heavy; j++ {
					if err := <-errs; err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(peakRSSMiB(), "peakRSS-MiB")
			}
		})
		b.Run(name+"-restores", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				debug.FreeOSMemory() // what earlier runs left is not counted
				resetPeakRSS()
				errs := make(chan error, heavy)
				for j := 0; j < heavy; j++ {
					go func() {
						in, err := os.Open(snap)
						if err != nil {
							errs <- err
							return
						}
						defer in.Close()
						dst := filepath.Join(dir, fmt.Sprintf("r-%s-%d-%d", name, i, j))
						os.Mkdir(dst, 0o755)
						defer os.RemoveAll(dst)
						_, err = archive.Extract(context.Background(), in, dst)
						errs <- err
					}()
				}
				for j := 0; j < heavy; j++ {
					if err := <-errs; err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(peakRSSMiB(), "peakRSS-MiB")
			}
		})
	}
}
