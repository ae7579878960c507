package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	hcsi "github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// BenchmarkStandbyPgbench: pgbench's TPC-B-like load (scale 10, 4
// clients, each commit fsynced, as BenchmarkPgbench) on PostgreSQL in an
// image volume with a standby copy on a second node, caught up every 2 s
// by changed blocks over the node-to-node transfer (mutual TLS over
// loopback), against the same load in an image volume without one, on
// the file systems that share blocks (a standby needs them), alternating
// in the same run. It reports TPS, p99 latency (from pgbench's
// per-transaction log) and, with a standby, the bytes each pull carried.
// Goal (issue 51): with a standby, at least 0.9x the TPS without.
func BenchmarkStandbyPgbench(b *testing.B) {
	testutil.RequireRoot(b)
	p := findPostgres(b)
	for _, fs := range fileSystems(b) {
		if !fs.reflink {
			continue
		}
		drivers, _ := peerDrivers(b, fs, "node-a", "node-b")
		a, s := drivers["node-a"], drivers["node-b"]
		a.Engine().SetStandbyNodes(func(context.Context) ([]string, error) { return []string{"node-a", "node-b"}, nil })
		counted, stop := runPulls(s)
		b.Cleanup(stop)
		type db struct{ name, sock string }
		var dbs []db
		for _, v := range []struct {
			name    string
			standby bool
		}{{"with-standby", true}, {"without", false}} {
			params := map[string]string{engine.ParamLayout: engine.LayoutImage}
			if v.standby {
				params[engine.ParamStandby], params[engine.ParamStandbyInterval] = "1", "2s"
			}
			id, mnt := mountedVolume(b, a, fs, "pg-"+v.name, 2<<30, params)
			if v.standby {
				if _, err := s.Engine().AddStandby(engine.StandbySpec{Volume: id, Primary: "node-a", Access: engine.AccessMount,
					Layout: engine.LayoutImage, Interval: 2 * time.Second, PV: "pv-" + v.name}); err != nil {
					b.Fatal(err)
				}
			}
			sock := outDir(b, fs, "pg-sock")
			p.serve(b, filepath.Join(mnt, "pgdata"), sock)
			p.do(b, "pgbench", "-h", sock, "-U", "postgres", "-i", "-q", "-s", "10", "postgres")
			dbs = append(dbs, db{v.name, sock})
		}
		for r := 0; r < *rounds; r++ {
			for _, d := range dbs {
				b.Run(fs.name+"/"+d.name, func(b *testing.B) {
					pulls0, pulled0 := counted()
					var tps, p99 float64
					for i := 0; i < b.N; i++ {
						prefix := filepath.Join(d.sock, fmt.Sprintf("txlog-%d-%d", r, i))
						out := p.do(b, "pgbench", "-h", d.sock, "-U", "postgres", "-c", "4", "-j", "2", "-T", fmt.Sprint(*pgSeconds), "-l", "--log-prefix="+prefix, "postgres")
						m := tpsLine.FindStringSubmatch(out)
						if m == nil {
							b.Fatalf("no tps in pgbench's output:\n%s", out)
						}
						v, _ := strconv.ParseFloat(m[1], 64)
						tps += v
						p99 += latencyP99(b, prefix)
					}
					b.ReportMetric(tps/float64(b.N), "tps")
					b.ReportMetric(p99/float64(b.N), "p99-ms")
					if d.name == "with-standby" {
						pulls1, pulled1 := counted()
						n, bytes := pulls1-pulls0, pulled1-pulled0
						// A run shorter than an interval (the smoke's) may
						// see no pull end.
						b.ReportMetric(float64(n)/float64(b.N), "pulls/op")
						if n > 0 {
							b.ReportMetric(float64(bytes)/float64(n), "bytes/pull")
						}
					}
				})
			}
		}
	}
}

// runPulls keeps the copies s keeps caught up (RunStandbys) until stop,
// which waits for it to end; counted is how many pulls succeeded so far
// and the bytes they carried.
func runPulls(s *hcsi.Driver) (counted func() (int, int64), stop func()) {
	var (
		mu     sync.Mutex
		pulls  int
		pulled int64
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Engine().RunStandbys(ctx, func(_ string, st engine.StandbyState, err error) {
			if err == nil {
				mu.Lock()
				pulls, pulled = pulls+1, pulled+st.Bytes
				mu.Unlock()
			}
		})
	}()
	counted = func() (int, int64) {
		mu.Lock()
		defer mu.Unlock()
		return pulls, pulled
	}
	return counted, func() { cancel(); <-done }
}

// latencyP99 is the 99th percentile, in milliseconds, of the transaction
// times pgbench logged in the files starting with prefix (-l: one line a
// transaction, its third field the time in microseconds).
func latencyP99(b *testing.B, prefix string) float64 {
	files, _ := filepath.Glob(prefix + "*")
	var us []float64
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) >= 3 {
				if v, err := strconv.ParseFloat(fields[2], 64); err == nil {
					us = append(us, v)
				}
			}
		}
		f.Close()
		os.Remove(name)
	}
	if len(us) == 0 {
		b.Fatalf("pgbench logged no transactions under %s", prefix)
	}
	slices.Sort(us)
	return us[len(us)*99/100] / 1000
}
