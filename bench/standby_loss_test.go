package bench

import (
	"context"
	"encoding/binary"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// lossSeconds is how long the failover writer writes before the cut (and
// a random part of an interval more).
var lossSeconds = flag.Int("bench.lossseconds", 10, "seconds of writing before each failover (BenchmarkStandbyFailoverLoss)")

// lossRecord is what the failover writer appends and fdatasyncs at a time
// (50 of them a second make 50 MiB/s).
const lossRecord = 1 << 20

// BenchmarkStandbyFailoverLoss: what a failover loses at 50 MiB/s of
// writes. An image volume with a standby copy on a second node, caught up
// every 2 s over the node-to-node transfer, takes a writer appending 1 MiB
// records to a file, each fdatasynced and acknowledged at its time, for
// 10 s (-bench.lossseconds) and a random part of an interval, so the cut
// falls at any phase of the pulls' cycle; then the primary is cut off as a power loss would (the writer
// stops, the pull under way is lost with it, no later one comes) and the
// standby's newest generation is promoted and staged there. It reports
// the MiB acknowledged but not in the promoted volume (the mean and the
// worst of b.N failovers) and the worst time before the cut at which the
// newest record the copy holds was acknowledged, in intervals; the goal
// (issue 51) is at most one interval.
func BenchmarkStandbyFailoverLoss(b *testing.B) {
	testutil.RequireRoot(b)
	const interval, rate = 2 * time.Second, 50
	writing := time.Duration(*lossSeconds) * time.Second
	for _, fs := range fileSystems(b) {
		if !fs.reflink {
			continue
		}
		b.Run(fs.name, func(b *testing.B) {
			// Where the cut falls between two pulls is chance: each
			// failover is one sample, and the worst is reported too.
			var sumMiB, worstMiB float64
			var worst time.Duration
			for i := 0; i < b.N; i++ {
				// The cut at any phase of the pulls' cycle.
				lostMiB, lostFor, _ := failoverLoss(b, fs, interval, rate, writing+rand.N(interval))
				sumMiB, worstMiB, worst = sumMiB+lostMiB, max(worstMiB, lostMiB), max(worst, lostFor)
			}
			b.ReportMetric(sumMiB/float64(b.N), "lost-MiB")
			b.ReportMetric(worstMiB, "worst-lost-MiB")
			b.ReportMetric(worst.Seconds()/interval.Seconds(), "worst-lost-intervals")
		})
	}
}

// failoverLoss runs one failover of BenchmarkStandbyFailoverLoss.
func failoverLoss(b *testing.B, fs *benchFS, interval time.Duration, rate int, writing time.Duration) (float64, time.Duration, int) {
	ctx := context.Background()
	drivers, _ := peerDrivers(b, fs, "node-a", "node-b")
	a, s := drivers["node-a"], drivers["node-b"]
	a.Engine().SetStandbyNodes(func(context.Context) ([]string, error) { return []string{"node-a", "node-b"}, nil })
	params := map[string]string{engine.ParamLayout: engine.LayoutImage, engine.ParamStandby: "1", engine.ParamStandbyInterval: interval.String()}
	id, mnt := mountedVolume(b, a, fs, "loss", 1<<30, params)
	if _, err := s.Engine().AddStandby(engine.StandbySpec{Volume: id, Primary: "node-a", Access: engine.AccessMount,
		Layout: engine.LayoutImage, Interval: interval, PV: "pv-loss"}); err != nil {
		b.Fatal(err)
	}
	counted, cut := runPulls(s)
	defer cut() // a second call finds it ended
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if n, _ := counted(); n > 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the standby made no generation in 30 s")
		}
	}

	// The writer: record n at n MiB, its number in its first 8 bytes,
	// acknowledged once fdatasynced.
	f, err := os.OpenFile(filepath.Join(mnt, "ledger"), os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, lossRecord)
	var acked []time.Time
	start := time.Now()
	for n := 0; time.Since(start) < writing; n++ {
		if wait := time.Until(start.Add(time.Duration(n) * time.Second / time.Duration(rate))); wait > 0 {
			time.Sleep(wait)
		}
		binary.LittleEndian.PutUint64(buf, uint64(n)+1)
		if _, err := f.WriteAt(buf, int64(n)*lossRecord); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		acked = append(acked, time.Now())
	}
	f.Close()
	// The power cut: no more writes, and the pull under way goes with the
	// primary.
	at := time.Now()
	cut()
	made, _ := counted()
	if _, err := s.Engine().PromoteStandby(ctx, id, "the benchmark cut its primary off"); err != nil {
		b.Fatal(err)
	}
	staging := outDir(b, fs, "loss-promoted")
	if _, err := s.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap}); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if _, err := s.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			unix.Unmount(staging, unix.MNT_DETACH)
		}
		s.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
	}()
	held := heldRecords(b, filepath.Join(staging, "ledger"), len(acked))
	lost := len(acked) - held
	var lostFor time.Duration
	if held < len(acked) {
		lostFor = at.Sub(start)
		if held > 0 {
			lostFor = at.Sub(acked[held-1])
		}
	}
	b.Logf("%s: %d of %d acknowledged records (1 MiB each, %d MiB/s) on the promoted copy after %d pulls; the newest held was acknowledged %v before the cut",
		fs.name, held, len(acked), rate, made, lostFor.Round(time.Millisecond))
	return float64(lost*lossRecord) / (1 << 20), lostFor, made
}

// heldRecords is how many of the ledger's first n records are there, each
// in its place, from the first.
func heldRecords(b *testing.B, path string, n int) int {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return 0 // no pull after the file was made
	}
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	head := make([]byte, 8)
	for i := 0; i < n; i++ {
		if _, err := f.ReadAt(head, int64(i)*lossRecord); err != nil || binary.LittleEndian.Uint64(head) != uint64(i)+1 {
			return i
		}
	}
	return n
}
