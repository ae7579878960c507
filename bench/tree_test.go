package bench

import (
	"bufio"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hostpath-csi/hostpath/archive"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

var rounds = flag.Int("bench.rounds", 1, "ours/theirs pairs per case, run alternately (the report takes medians)")

// variant is one way to do the job: ours, or the tool a user would run.
type variant struct {
	name string
	run  func(b *testing.B, dst string)
}

// compare runs the variants alternately, rounds times, as sub-benchmarks
// named case/variant, each with SetBytes(bytes).
func compare(b *testing.B, name string, bytes int64, fs *benchFS, vs []variant) {
	for r := 0; r < *rounds; r++ {
		for _, v := range vs {
			b.Run(name+"/"+v.name, func(b *testing.B) {
				b.SetBytes(bytes)
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					dst := outDir(b, fs, v.name)
					// Every run starts with nothing dirty: what the run
					// before wrote is not flushed on this run's time.
					syncFS(fs.dir)
					resetPeakRSS()
					b.StartTimer()
					v.run(b, dst)
				}
				if rss := peakRSSMiB(); rss >= 0 && strings.HasPrefix(v.name, "ours") {
					b.ReportMetric(rss, "peakRSS-MiB")
				}
			})
		}
	}
}

func BenchmarkClone(b *testing.B) {
	testutil.RequireRoot(b)
	for _, fs := range fileSystems(b) {
		for _, ds := range dataSets {
			src, size := source(b, fs, ds)
			vs := []variant{
				{"ours", func(b *testing.B, dst string) {
					if _, err := fsops.CopyTree(context.Background(), src, dst); err != nil {
						b.Fatal(err)
					}
				}},
				{"cp-a", func(b *testing.B, dst string) { run(b, "cp", "-a", src+"/.", dst) }},
			}
			if fs.reflink {
				vs = append(vs, variant{"cp-a-reflink-never", func(b *testing.B, dst string) {
					run(b, "cp", "-a", "--reflink=never", src+"/.", dst)
				}})
			}
			compare(b, fs.name+"/"+ds.name, size, fs, vs)
		}
	}
}

func BenchmarkSnapshot(b *testing.B) {
	testutil.RequireRoot(b)
	for _, fs := range fileSystems(b) {
		for _, ds := range dataSets {
			src, size := source(b, fs, ds)
			vs := []variant{
				{"ours", func(b *testing.B, dst string) {
					f, err := os.Create(filepath.Join(dst, "snap.tar.gz"))
					if err != nil {
						b.Fatal(err)
					}
					defer f.Close()
					if _, err := archive.Write(context.Background(), src, f, archive.Options{}); err != nil {
						b.Fatal(err)
					}
					reportSize(b, f.Name())
				}},
				{"tar-czf", func(b *testing.B, dst string) {
					run(b, "tar", "czf", filepath.Join(dst, "snap.tar.gz"), "-C", src, ".")
					reportSize(b, filepath.Join(dst, "snap.tar.gz"))
				}},
			}
			if have("pigz") {
				vs = append(vs, variant{"tar-pigz", func(b *testing.B, dst string) {
					run(b, "tar", "-I", "pigz", "-cf", filepath.Join(dst, "snap.tar.gz"), "-C", src, ".")
				}})
			}
			// zstd: the peer a user who cares about speed runs today.
			vs = append(vs, variant{"ours-zstd", func(b *testing.B, dst string) {
				f, err := os.Create(filepath.Join(dst, "snap.tar.zst"))
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				if _, err := archive.Write(context.Background(), src, f, archive.Options{Zstd: true}); err != nil {
					b.Fatal(err)
				}
				reportSize(b, f.Name())
			}})
			// The ceiling: reading the tree into an uncompressed tar
			// stream (through cat: GNU tar reads nothing when its
			// output is /dev/null itself).
			vs = append(vs, variant{"tar-cf-uncompressed", func(b *testing.B, dst string) {
				run(b, "sh", "-c", "tar cf - -C \""+src+"\" . | cat > /dev/null")
			}})
			if have("zstd") {
				vs = append(vs, variant{"tar-zstd-T0-3", func(b *testing.B, dst string) {
					run(b, "tar", "-I", "zstd -T0 -3", "-cf", filepath.Join(dst, "snap.tar.zst"), "-C", src, ".")
					reportSize(b, filepath.Join(dst, "snap.tar.zst"))
				}})
			}
			if fs.reflink {
				// A reflinked copy is the snapshot where blocks can be shared.
				vs = append(vs, variant{"ours-reflink", func(b *testing.B, dst string) {
					st, err := fsops.CopyTree(context.Background(), src, dst)
					if err != nil {
						b.Fatal(err)
					}
					if st.Reflinked != st.Files {
						b.Fatalf("only %d of %d files were reflinked", st.Reflinked, st.Files)
					}
				}})
			}
			compare(b, fs.name+"/"+ds.name, size, fs, vs)
		}
	}
}

func BenchmarkRestore(b *testing.B) {
	testutil.RequireRoot(b)
	for _, fs := range fileSystems(b) {
		for _, ds := range dataSets {
			src, size := source(b, fs, ds)
			snap := filepath.Join(fs.dir, "restore-"+ds.name+".tar.gz")
			if _, err := os.Stat(snap); err != nil {
				f, err := os.Create(snap)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := archive.Write(context.Background(), src, f, archive.Options{}); err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
			zsnap := filepath.Join(fs.dir, "restore-"+ds.name+".tar.zst")
			if _, err := os.Stat(zsnap); err != nil {
				f, err := os.Create(zsnap)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := archive.Write(context.Background(), src, f, archive.Options{Zstd: true}); err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
			extract := func(snap string) func(b *testing.B, dst string) {
				return func(b *testing.B, dst string) {
					f, err := os.Open(snap)
					if err != nil {
						b.Fatal(err)
					}
					defer f.Close()
					if _, err := archive.Extract(context.Background(), bufio.NewReaderSize(f, 1<<20), dst); err != nil {
						b.Fatal(err)
					}
				}
			}
			vs := []variant{
				{"ours", extract(snap)},
				{"tar-xzf", func(b *testing.B, dst string) { run(b, "tar", "xzf", snap, "-C", dst) }},
				{"ours-zstd", extract(zsnap)},
			}
			if have("zstd") {
				vs = append(vs, variant{"tar-I-zstd-xf", func(b *testing.B, dst string) { run(b, "tar", "-I", "zstd", "-xf", zsnap, "-C", dst) }})
			}
			compare(b, fs.name+"/"+ds.name, size, fs, vs)
		}
	}
}

// BenchmarkBlockSnapshot copies a sparse backing file: 16x the data set
// size in apparent size, the data set's size in scattered data.
func BenchmarkBlockSnapshot(b *testing.B) {
	testutil.RequireRoot(b)
	for _, fs := range fileSystems(b) {
		img := filepath.Join(fs.dir, "block.img")
		data := int64(*sizeMiB) << 20
		if _, err := os.Stat(img); err != nil {
			makeSparseImage(b, img, 16*data, data)
		}
		vs := []variant{
			{"ours", func(b *testing.B, dst string) {
				in, err := os.Open(img)
				if err != nil {
					b.Fatal(err)
				}
				defer in.Close()
				out, err := os.Create(filepath.Join(dst, "snap.img"))
				if err != nil {
					b.Fatal(err)
				}
				defer out.Close()
				fi, _ := in.Stat()
				if _, err := fsops.CopyFileData(context.Background(), int(out.Fd()), int(in.Fd()), fi.Size(), nil); err != nil {
					b.Fatal(err)
				}
			}},
			{"cp", func(b *testing.B, dst string) { run(b, "cp", img, filepath.Join(dst, "snap.img")) }},
		}
		if fs.reflink {
			vs = append(vs, variant{"cp-reflink-never", func(b *testing.B, dst string) {
				run(b, "cp", "--reflink=never", img, filepath.Join(dst, "snap.img"))
			}})
		}
		compare(b, fs.name+"/sparse", data, fs, vs)
	}
}

func makeSparseImage(b *testing.B, path string, size, data int64) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 4<<20)
	for i := range chunk {
		chunk[i] = byte(i*131 + i/4096)
	}
	n := data / int64(len(chunk))
	for i := int64(0); i < n; i++ {
		if _, err := f.WriteAt(chunk, i*(size/n)); err != nil {
			b.Fatal(err)
		}
	}
	f.Sync()
}

func reportSize(b *testing.B, path string) {
	if fi, err := os.Stat(path); err == nil {
		b.ReportMetric(float64(fi.Size()), "archive-bytes")
	}
}

// resetPeakRSS and peakRSSMiB measure the peak resident memory of what runs
// in between (clear_refs 5 resets VmHWM).
var rssBefore float64

func resetPeakRSS() {
	os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	rssBefore = statusKiB("VmRSS")
}

func peakRSSMiB() float64 {
	hwm := statusKiB("VmHWM")
	if hwm < 0 || rssBefore < 0 {
		return -1
	}
	return (hwm - rssBefore) / 1024
}

func statusKiB(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
