package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// fioJobs are the I/O patterns the image layout must not slow (issue 27:
// at least 0.9x): 4 KiB random and 1 MiB sequential, reads and writes,
// all O_DIRECT.
var fioJobs = []fioJob{
	{"randread-4k", "randread", "4k", 16, "64m"},
	{"randwrite-4k", "randwrite", "4k", 16, "64m"},
	{"read-1m", "read", "1m", 4, "256m"},
	{"write-1m", "write", "1m", 4, "256m"},
}

// fioJob is one of fioJobs.
type fioJob struct {
	name, rw, bs string
	depth        int
	io           string // bytes moved per run
}

// fioRun is a sub-benchmark running job j on file: fio's runtime as
// ns/op, its bandwidth as MB/s.
func fioRun(b *testing.B, name, file string, j fioJob) {
	b.Run(name, func(b *testing.B) {
		var ns, mbs float64
		for i := 0; i < b.N; i++ {
			n, m := fio(b, file, j.rw, j.bs, j.depth, j.io)
			ns, mbs = ns+n, mbs+m
		}
		b.ReportMetric(ns/float64(b.N), "ns/op")
		b.ReportMetric(mbs/float64(b.N), "MB/s")
	})
}

// fio runs one job on file (laid out beforehand, outside the timing) and
// returns fio's own runtime of the job in ns and its bandwidth in MB/s.
func fio(b *testing.B, file, rw, bs string, depth int, io string) (float64, float64) {
	out, err := exec.Command("fio", "--name=j", "--filename="+file, "--size=256m", "--io_size="+io, "--rw="+rw, "--bs="+bs,
		"--direct=1", "--ioengine=libaio", fmt.Sprintf("--iodepth=%d", depth), "--end_fsync=1", "--output-format=json").Output()
	if err != nil {
		b.Fatalf("fio %s %s on %s: %v", rw, bs, file, err)
	}
	var r struct {
		Jobs []struct {
			Runtime     float64 `json:"job_runtime"` // ms
			Read, Write struct {
				BW float64 `json:"bw_bytes"`
			}
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Jobs) != 1 {
		b.Fatalf("fio's output: %v", err)
	}
	j := r.Jobs[0]
	return j.Runtime * 1e6, (j.Read.BW + j.Write.BW) / 1e6
}

// BenchmarkImageIO: fio on a file in an image volume's own file system
// (through its loop device, with direct I/O) against the same fio on a
// file in the pool itself, both O_DIRECT, on each fresh pool file system,
// in the same run. ns/op is fio's runtime of the job; the goal (issue 27)
// is at least 0.9x the pool's speed.
func BenchmarkImageIO(b *testing.B) {
	testutil.RequireRoot(b)
	if !have("fio") {
		b.Fatal("fio is needed (make deps installs it)")
	}
	for _, fs := range fileSystems(b) {
		_, mnt := mountedVolume(b, benchDriver(b, fs, "io"), fs, "io", 1<<30, imageParams)
		in := filepath.Join(mnt, "fio.dat")
		beside := filepath.Join(outDir(b, fs, "io-pool"), "fio.dat")
		for _, f := range []string{in, beside} {
			// Laid out once, allocated, outside the timing.
			fio(b, f, "write", "1m", 4, "256m")
			defer os.Remove(f)
		}
		for _, j := range fioJobs {
			for r := 0; r < *rounds; r++ {
				for _, v := range []struct{ name, file string }{{"ours", in}, {"pool-file", beside}} {
					fioRun(b, fmt.Sprintf("%s/%s/%s", fs.name, j.name, v.name), v.file, j)
				}
			}
		}
	}
}
